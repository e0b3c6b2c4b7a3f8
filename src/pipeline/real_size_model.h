// Complete DiT model folders at their real sizes with seeded random weights (`diffuse
// create-demo-model --arch flux-dev|flux-schnell|flux-kontext|hidream-i1|hidream-e1`): every
// component at the real configuration, in the layout the real repositories have, the tokenizers
// this project's own trainers learn from its prompt corpus (the embedding tables keep their real
// row counts). Random weights cost exactly the memory and time real ones do, so whole runs can
// be measured where no model can be downloaded.
//
// Written unit by unit (a block, an embedding table): each is filled, written and freed, so that
// making a 17B transformer holds about one shard, not the network. Everything goes into a
// sibling folder that is renamed to the target only when complete: a failed or interrupted
// write (a full disk) leaves no folder that later loads.
#pragma once
#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace diffuse::pipeline {

struct RandomTextEncoderSpec {
  std::string component;    // "text_encoder_3"
  std::string tokenizer;    // "tokenizer_3"
  std::string kind;         // "clip", "t5", "llama"
  nlohmann::json config;    // its config.json (CLIP: architectures says whether it projects)
  int64_t max_length = 77;  // the tokenizer's model_max_length
};

struct RandomDitFolderSpec {
  std::string arch;            // for messages
  std::string family;          // "flux" or "hidream": which transformer class
  std::string pipeline_class;  // model_index.json's _class_name
  nlohmann::json transformer, vae, scheduler;
  std::vector<RandomTextEncoderSpec> text_encoders;
};

// The real configuration of `arch`; InvalidArgument listing the names otherwise.
RandomDitFolderSpec real_size_dit_spec(const std::string& arch);
std::vector<std::string> real_size_dit_archs();  // flux-dev, flux-schnell, flux-kontext, hidream-*
bool is_real_size_dit_arch(const std::string& arch);

struct RandomFolderOptions {
  uint64_t seed = 20261207;
  // bf16 or fp16 as the real repositories ship; q8_0: the transformer as a GGUF of ggml's q8_0
  // blocks (its linear and embedding matrices; the rest bf16), the rest bf16.
  std::string weights = "bf16";
  int64_t shard_bytes = int64_t{5} << 30;  // safetensors shards of about this size
  std::function<void(const std::string&)> log;
};

struct RandomFolderReport {
  std::vector<std::pair<std::string, int64_t>> components;  // component, bytes on disk
  int64_t bytes = 0;
};

// One network of `kind` ("clip", "t5", "llama", "flux", "hidream", "vae") at `config` with
// random weights into root/component (config.json and the weights: one file, shards of
// options.shard_bytes with their index, or a q8_0 GGUF), unit by unit. Returns the bytes written.
int64_t write_random_component(const std::string& root, const std::string& component,
                               const std::string& kind, const nlohmann::json& config,
                               const RandomFolderOptions& options);

// Writes the folder `dir` (which must not exist, or be empty). InvalidArgument for an unknown
// weights type or when the disk under `dir` has less free space than the estimate (before
// writing anything); IoError when a write fails (nothing is left behind).
RandomFolderReport write_random_dit_folder(const std::string& dir, const RandomDitFolderSpec& spec,
                                           const RandomFolderOptions& options = {});

}  // namespace diffuse::pipeline
