#include "text/tokenizer_files.h"
#include "io/input_file.h"

#include <fstream>
#include <sstream>

#include "diffuse/errors.h"

namespace diffuse::text {

std::string read_tokenizer_file(const std::filesystem::path& path) {
  io::require_regular_file(path.string(), "tokenizer file");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw IoError("cannot open tokenizer file '" + path.string() + "'");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace diffuse::text
