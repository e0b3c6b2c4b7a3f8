#include "io/atomic_file.h"

#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "diffuse/errors.h"

namespace diffuse::io {
namespace {

// path + ".tmp.<pid>.<n>", with the file name shortened where the suffix would push it past
// the file system's name limit (a legal 254-character name must still be writable).
std::string make_temp_name(const std::string& path) {
  static std::atomic<unsigned> counter{0};
  const std::string suffix = ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter++);
  const std::filesystem::path p(path);
  std::string name = p.filename().string();
  constexpr size_t kNameMax = 255;
  if (name.size() + suffix.size() > kNameMax) name.resize(kNameMax - suffix.size());
  return (p.parent_path() / (name + suffix)).string();
}

// Refuses to replace anything but a regular file (lstat: a symlink to one is replaced by a
// file, as rename does for any path).
void check_replaceable(const std::string& path) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) return;  // nothing there yet
  if (S_ISREG(st.st_mode) || S_ISLNK(st.st_mode)) return;
  const char* kind = S_ISDIR(st.st_mode)    ? "a directory"
                     : S_ISCHR(st.st_mode)  ? "a character device"
                     : S_ISBLK(st.st_mode)  ? "a block device"
                     : S_ISFIFO(st.st_mode) ? "a named pipe"
                     : S_ISSOCK(st.st_mode) ? "a socket"
                                            : "not a regular file";
  throw IoError("'" + path + "' exists and is " + kind + "; refusing to replace it");
}

}  // namespace

void check_output_path(const std::string& path, const std::string& what) {
  if (path.empty()) throw InvalidArgument(what + " path is empty");
  check_replaceable(path);
  std::filesystem::path parent = std::filesystem::path(path).parent_path();
  if (parent.empty()) parent = ".";
  std::error_code ec;
  if (!std::filesystem::is_directory(parent, ec))
    throw IoError(what + " folder '" + parent.string() + "' does not exist");
  if (::access(parent.c_str(), W_OK | X_OK) != 0)
    throw IoError(what + " folder '" + parent.string() +
                  "' is not writable: " + std::strerror(errno));
}

AtomicFile::AtomicFile(std::string path)
    : path_(std::move(path)), temp_path_(make_temp_name(path_)) {}

AtomicFile::~AtomicFile() {
  if (!committed_) std::remove(temp_path_.c_str());
}

void AtomicFile::commit() {
  try {
    check_replaceable(path_);
  } catch (...) {
    std::remove(temp_path_.c_str());
    throw;
  }
  if (std::rename(temp_path_.c_str(), path_.c_str()) != 0) {
    int err = errno;
    std::remove(temp_path_.c_str());
    throw IoError("cannot rename '" + temp_path_ + "' to '" + path_ + "': " + std::strerror(err));
  }
  committed_ = true;
}

void write_file_atomically(const std::string& path,
                           const std::function<void(std::ostream&)>& write) {
  AtomicFile file(path);
  {
    std::ofstream out(file.temp_path(), std::ios::binary | std::ios::trunc);
    if (!out) {
      throw IoError("cannot open '" + file.temp_path() + "' for writing: " + std::strerror(errno));
    }
    write(out);
    out.flush();
    if (!out) throw IoError("write to '" + file.temp_path() + "' failed (disk full?)");
  }
  file.commit();
}

}  // namespace diffuse::io
