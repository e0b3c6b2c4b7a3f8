#include "io/input_file.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "diffuse/errors.h"

namespace diffuse::io {

void require_regular_file(const std::string& path, const std::string& what) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0)
    throw IoError("cannot open " + what + " '" + path + "': " + std::strerror(errno));
  if (S_ISREG(st.st_mode)) return;
  const char* kind = S_ISDIR(st.st_mode)                          ? "a directory"
                     : S_ISFIFO(st.st_mode)                       ? "a FIFO (named pipe)"
                     : S_ISSOCK(st.st_mode)                       ? "a socket"
                     : S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode) ? "a device"
                                                                  : "not a regular file";
  throw IoError(what + " '" + path + "' is " + kind + ", expected a regular file");
}

void require_inside_folder(const std::string& relative, const std::string& source,
                           const std::string& what) {
  const std::filesystem::path p(relative);
  bool escapes = relative.empty() || p.is_absolute() || p.has_root_name();
  for (const auto& part : p) escapes = escapes || part == "..";
  if (escapes)
    throw FormatError(source + ": " + what + " '" + relative +
                      "' is not a file name inside the folder (absolute paths and '..' are "
                      "refused)");
}

}  // namespace diffuse::io
