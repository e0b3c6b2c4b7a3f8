// Reading the files of a tokenizer folder (vocab.json, merges.txt, tokenizer.json, ...).
#pragma once
#include <filesystem>
#include <string>

namespace diffuse::text {

// The whole file as bytes; IoError naming the file if it cannot be opened.
std::string read_tokenizer_file(const std::filesystem::path& path);

}  // namespace diffuse::text
