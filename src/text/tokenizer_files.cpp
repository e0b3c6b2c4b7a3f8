#include "text/tokenizer_files.h"

#include <fstream>
#include <sstream>
#include <unordered_map>

#include "io/input_file.h"

#include "diffuse/errors.h"
#include "io/atomic_file.h"
#include "text/unicode.h"

namespace diffuse::text {
namespace {

// Streams vocab.json ({"token": id, ...}) straight into the map: building a JSON tree of 49k
// entries first would triple the load time.
class VocabReader : public nlohmann::json_sax<nlohmann::json> {
 public:
  VocabReader(std::string path, std::unordered_map<std::string, int64_t>& vocab)
      : path_(std::move(path)), vocab_(vocab) {}

  bool start_object(std::size_t) override {
    if (depth_++ != 0) fail("expected token -> integer id pairs, found a nested object");
    return true;
  }
  bool end_object() override { return --depth_, true; }
  bool key(string_t& k) override { return key_ = k, true; }
  bool number_integer(number_integer_t v) override { return add(v); }
  bool number_unsigned(number_unsigned_t v) override {
    if (v > static_cast<number_unsigned_t>(INT64_MAX)) fail("id of '" + key_ + "' is too large");
    return add(static_cast<int64_t>(v));
  }
  bool null() override { return wrong_value("null"); }
  bool boolean(bool) override { return wrong_value("a boolean"); }
  bool number_float(number_float_t, const string_t&) override { return wrong_value("a float"); }
  bool string(string_t&) override { return wrong_value("a string"); }
  bool binary(binary_t&) override { return wrong_value("binary data"); }
  bool start_array(std::size_t) override { return wrong_value("an array"); }
  bool end_array() override { return true; }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) override {
    throw FormatError(path_ + ": invalid JSON (" + e.what() + ")");
  }

 private:
  [[noreturn]] void fail(const std::string& problem) {
    throw FormatError(path_ + ": " + problem + " (expected a JSON object token -> id)");
  }
  bool wrong_value(const std::string& what) {
    if (depth_ == 0) fail("top level is " + what);
    fail("token '" + key_ + "' has " + what + " as its id");
  }
  bool add(int64_t id) {
    if (depth_ != 1) fail("top level is a number");
    if (id < 0) fail("token '" + key_ + "' has a negative id");
    vocab_[key_] = id;
    return true;
  }

  std::string path_;
  std::unordered_map<std::string, int64_t>& vocab_;
  std::string key_;
  int depth_ = 0;
};

}  // namespace

void read_vocab_json(const std::filesystem::path& path,
                     std::unordered_map<std::string, int64_t>& vocab) {
  const std::string text = read_tokenizer_file(path);
  VocabReader reader(path.string(), vocab);
  vocab.reserve(text.size() / 16);
  nlohmann::json::sax_parse(text, &reader);  // throws FormatError through the reader
}

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
