#include "io/atomic_file.h"

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
std::string make_temp_name(const std::string& path) {
  static std::atomic<unsigned> counter{0};
  return path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter++);
}
}  // namespace

AtomicFile::AtomicFile(std::string path) : path_(std::move(path)), temp_path_(make_temp_name(path_)) {}

AtomicFile::~AtomicFile() {
  if (!committed_) std::remove(temp_path_.c_str());
}

void AtomicFile::commit() {
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
