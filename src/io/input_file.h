// Files read as input are checked by type before they are opened: opening a FIFO blocks until
// a writer appears (a weights file or an image given as a named pipe hung forever), and a
// directory or device is never what was meant.
#pragma once
#include <string>

namespace diffuse::io {

// IoError unless `path` exists and is a regular file (after symlinks): "<what> '<path>': ..."
// says what it is instead (a FIFO, a directory, a device, a socket) or why it cannot be read.
void require_regular_file(const std::string& path, const std::string& what);

// Whether `relative` (a file name from inside a model or golden folder, e.g. a shard of a
// weight_map) stays inside that folder: no absolute path, no "..". FormatError naming `source`
// otherwise.
void require_inside_folder(const std::string& relative, const std::string& source,
                           const std::string& what);

}  // namespace diffuse::io
