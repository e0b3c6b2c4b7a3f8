#include "text/tokenizer_files.h"
#include "io/input_file.h"

#include <fstream>
#include <sstream>

#include "diffuse/errors.h"
#include "io/atomic_file.h"
#include "text/unicode.h"

namespace diffuse::text {

std::string read_tokenizer_file(const std::filesystem::path& path) {
  io::require_regular_file(path.string(), "tokenizer file");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw IoError("cannot open tokenizer file '" + path.string() + "'");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void create_tokenizer_folder(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (!std::filesystem::is_directory(dir, ec))
    throw IoError("cannot create tokenizer folder '" + dir + "'");
}

void write_tokenizer_json(const std::string& dir, const std::string& name,
                          const nlohmann::ordered_json& j) {
  io::write_file_atomically((std::filesystem::path(dir) / name).string(),
                            [&](std::ostream& out) { out << j.dump(2) << "\n"; });
}

void check_training_input(const std::vector<std::string>& corpus, int64_t model_max_length,
                          const std::string& what) {
  if (model_max_length < 1)
    throw InvalidArgument(what + ": model_max_length " + std::to_string(model_max_length) +
                          " must be at least 1");
  for (size_t i = 0; i < corpus.size(); ++i) {
    try {
      utf8_decode(corpus[i]);
    } catch (const InvalidArgument& e) {
      throw InvalidArgument(what + ": sentence " + std::to_string(i) + ": " + e.what());
    }
  }
}

}  // namespace diffuse::text
