// Reading and writing the files of a tokenizer folder (vocab.json, merges.txt, tokenizer.json,
// tokenizer_config.json, ...), and the input checks the tokenizer trainers share.
#pragma once
#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <unordered_map>
#include <vector>

namespace diffuse::text {

// The whole file as bytes; IoError naming the file if it cannot be opened.
std::string read_tokenizer_file(const std::filesystem::path& path);

// Streams vocab.json ({"token": id, ...}) into `vocab` (building a JSON tree of the whole file
// first would triple the load time); FormatError naming the file for anything else.
void read_vocab_json(const std::filesystem::path& path,
                     std::unordered_map<std::string, int64_t>& vocab);

// Creates the folder a trainer saves a tokenizer to (and its parents); IoError naming it if
// that fails.
void create_tokenizer_folder(const std::string& dir);

// Writes `j` as dir/name, indented by 2 with a final newline (as transformers saves configs),
// atomically. Keys keep their insertion order, so equal content gives equal bytes.
void write_tokenizer_json(const std::string& dir, const std::string& name,
                          const nlohmann::ordered_json& j);

// A trainer's inputs: InvalidArgument starting with `what` ("T5 tokenizer training") for
// model_max_length < 1 or a sentence that is not valid UTF-8 (naming its index), so that a
// bad corpus is refused before anything is written.
void check_training_input(const std::vector<std::string>& corpus, int64_t model_max_length,
                          const std::string& what);

}  // namespace diffuse::text
