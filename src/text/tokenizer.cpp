#include "text/tokenizer.h"

#include <algorithm>
#include <filesystem>
#include <list>
#include <mutex>
#include <utility>
#include <vector>

#include "diffuse/errors.h"
#include "io/json_config.h"
#include "text/clip_tokenizer.h"
#include "text/llama_tokenizer.h"
#include "text/t5_tokenizer.h"

namespace fs = std::filesystem;

namespace diffuse::text {
namespace {

// Adapts a concrete tokenizer (same member names) to the interface.
template <typename T>
class Adapter : public Tokenizer {
 public:
  Adapter(std::string kind, T tok) : kind_(std::move(kind)), tok_(std::move(tok)) {}
  std::string kind() const override { return kind_; }
  std::vector<int64_t> encode(const std::string& text) const override { return tok_.encode(text); }
  TokenBatch encode_padded(const std::vector<std::string>& texts,
                           int64_t max_length) const override {
    return tok_.encode_padded(texts, max_length);
  }
  int64_t bos_id() const override {
    if constexpr (has_bos<T>(0)) return tok_.bos_id();
    return -1;
  }
  int64_t eos_id() const override { return tok_.eos_id(); }
  int64_t pad_id() const override { return tok_.pad_id(); }
  int64_t model_max_length() const override { return tok_.model_max_length(); }

 private:
  template <typename U>
  static constexpr auto has_bos(int) -> decltype(std::declval<U>().bos_id(), bool()) {
    return true;
  }
  template <typename U>
  static constexpr bool has_bos(...) {
    return false;
  }

  std::string kind_;
  T tok_;
};

}  // namespace

bool is_qwen2_tokenizer_folder(const std::string& dir) {
  const fs::path config = fs::path(dir) / "tokenizer_config.json";
  if (!fs::exists(config)) return false;
  const auto cfg = io::JsonConfig::load(config.string());
  return cfg.get<std::string>("tokenizer_class", "").rfind("Qwen2Tokenizer", 0) == 0;
}

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& dir_str) {
  const fs::path dir(dir_str);
  if (!fs::is_directory(dir)) throw IoError("tokenizer folder '" + dir_str + "' does not exist");
  if (fs::exists(dir / "spiece.model"))
    return std::make_unique<Adapter<T5Tokenizer>>("t5", T5Tokenizer::from_folder(dir_str));
  if (is_qwen2_tokenizer_folder(dir_str) && fs::exists(dir / "vocab.json") &&
      fs::exists(dir / "merges.txt"))
    return std::make_unique<Adapter<LlamaTokenizer>>("qwen2", load_qwen2_tokenizer(dir_str));
  if (fs::exists(dir / "vocab.json") && fs::exists(dir / "merges.txt"))
    return std::make_unique<Adapter<ClipTokenizer>>("clip", ClipTokenizer::from_folder(dir_str));
  if (fs::exists(dir / "tokenizer.json"))
    return std::make_unique<Adapter<LlamaTokenizer>>("llama", LlamaTokenizer::from_folder(dir_str));
  throw IoError("tokenizer folder '" + dir_str +
                "' has no spiece.model (T5), vocab.json + merges.txt (CLIP, or Qwen2 when "
                "tokenizer_config.json names Qwen2Tokenizer) or tokenizer.json (Llama-3)");
}

namespace {

// The folder and what is in it now: a file replaced in place is read again.
std::string folder_key(const std::string& dir) {
  std::error_code ec;
  std::string key = fs::weakly_canonical(dir, ec).string();
  std::vector<std::string> entries;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (!e.is_regular_file(ec)) continue;
    entries.push_back(e.path().filename().string() + ":" + std::to_string(e.file_size(ec)) + ":" +
                      std::to_string(e.last_write_time(ec).time_since_epoch().count()));
  }
  std::sort(entries.begin(), entries.end());
  for (const auto& e : entries) key += "\n" + e;
  return key;
}

// The last few tokenizers of type T that `load` made, by folder_key. Loading happens under the
// lock: ranks of one process asking for the same folder wait for the one parse.
template <typename T, typename Load>
std::shared_ptr<const T> cached(const std::string& dir, Load load) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return load(dir);  // its error, naming the folder
  auto key = folder_key(dir);
  constexpr size_t kKept = 6;  // a HiDream folder's four, with room for a second model
  static std::mutex mu;
  static std::list<std::pair<std::string, std::shared_ptr<const T>>> recent;
  std::lock_guard<std::mutex> lock(mu);
  for (auto it = recent.begin(); it != recent.end(); ++it)
    if (it->first == key) {
      recent.splice(recent.begin(), recent, it);
      return recent.front().second;
    }
  std::shared_ptr<const T> loaded = load(dir);
  recent.emplace_front(std::move(key), loaded);
  if (recent.size() > kKept) recent.pop_back();
  return loaded;
}

}  // namespace

std::shared_ptr<const Tokenizer> shared_tokenizer(const std::string& dir) {
  return cached<Tokenizer>(dir, [](const std::string& d) { return load_tokenizer(d); });
}

std::shared_ptr<const LlamaTokenizer> shared_qwen2_tokenizer(const std::string& dir) {
  return cached<LlamaTokenizer>(dir, [](const std::string& d) {
    return std::make_shared<const LlamaTokenizer>(load_qwen2_tokenizer(d));
  });
}

}  // namespace diffuse::text
