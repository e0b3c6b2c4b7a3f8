// Complete model folders at their real sizes with seeded random weights (`diffuse
// create-demo-model --arch sd1.5|sd2.1-base|sd2.1|sdxl|flux-dev|flux-schnell|flux-kontext|
// hidream-i1|hidream-e1`): every
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

struct RandomFolderSpec {
  std::string arch;            // for messages
  std::string family;          // "unet", "flux" or "hidream": which denoiser class
  std::string pipeline_class;  // model_index.json's _class_name
  nlohmann::json denoiser, vae, scheduler;
  std::vector<RandomTextEncoderSpec> text_encoders;
  nlohmann::json index_extras = nlohmann::json::object();  // more model_index.json entries
  std::string default_weights = "bf16";  // what the real repositories ship (SD: fp16 variants)

  // The denoiser's folder: "unet" or "transformer".
  std::string denoiser_component() const { return family == "unet" ? "unet" : "transformer"; }
};

// The real configuration of `arch`; InvalidArgument listing the names otherwise.
RandomFolderSpec real_size_spec(const std::string& arch);
// sd1.5, sd2.1-base, sd2.1, sdxl, tiny (a small UNet for tests and quick checks), flux-dev,
// flux-schnell, flux-kontext, hidream-i1, hidream-e1.
std::vector<std::string> real_size_archs();
bool is_real_size_arch(const std::string& arch);

struct RandomFolderOptions {
  uint64_t seed = 20261207;
  // bf16 or fp16 as the real repositories ship; q8_0: the denoiser as a GGUF of ggml's q8_0
  // blocks (its matrices whose rows are whole blocks; the rest bf16), the rest bf16. Empty: the
  // spec's default_weights (bf16 for write_random_component).
  std::string weights;
  int64_t shard_bytes = int64_t{5} << 30;  // safetensors shards of about this size
  std::function<void(const std::string&)> log;
};

struct RandomFolderReport {
  std::vector<std::pair<std::string, int64_t>> components;  // component, bytes on disk
  int64_t bytes = 0;
};

// One network of `kind` ("clip", "t5", "llama", "unet", "flux", "hidream", "vae") at `config` with
// random weights into root/component (config.json and the weights: one file, shards of
// options.shard_bytes with their index, or a q8_0 GGUF), unit by unit. Returns the bytes written.
int64_t write_random_component(const std::string& root, const std::string& component,
                               const std::string& kind, const nlohmann::json& config,
                               const RandomFolderOptions& options);

// Writes the folder `dir` (which must not exist, or be empty). InvalidArgument for an unknown
// weights type or when the disk under `dir` has less free space than the estimate (before
// writing anything); IoError when a write fails (nothing is left behind).
RandomFolderReport write_random_folder(const std::string& dir, const RandomFolderSpec& spec,
                                       const RandomFolderOptions& options = {});

}  // namespace diffuse::pipeline
