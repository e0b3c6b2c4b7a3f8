// Writes a file under a temporary name in the same folder and renames it into place, so a
// reader never sees a half-written file and a failure leaves nothing behind.
#pragma once
#include <functional>
#include <ostream>
#include <string>

namespace diffuse::io {

// Checks, before any work is done, that `path` can take a new file: not empty, its folder
// exists and is writable, and it is not something other than a regular file (a directory, a
// device, a FIFO or a socket would be destroyed by the final rename). `what` names the file in
// messages ("output"). IoError / InvalidArgument naming the path otherwise.
void check_output_path(const std::string& path, const std::string& what);

// Calls `write` with a stream on a temporary file next to `path`, then renames it to `path`.
// Throws IoError (and removes the temporary file) if anything fails.
void write_file_atomically(const std::string& path,
                           const std::function<void(std::ostream&)>& write);

// Same for callers that write through a C FILE* (libpng): returns the temporary path to
// write to; commit() renames it, and the destructor removes it unless committed.
class AtomicFile {
 public:
  explicit AtomicFile(std::string path);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  const std::string& temp_path() const { return temp_path_; }
  void commit();

 private:
  std::string path_;
  std::string temp_path_;
  bool committed_ = false;
};

}  // namespace diffuse::io
