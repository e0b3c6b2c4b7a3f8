// LoRA adapters for any network, addressed by parameter name: a file (peft / diffusers or
// kohya / A1111 naming, see io/lora_key_map.h) is read, every pair is mapped onto a weight of
// one of the given networks and checked (rank, shape, finite values) before anything is
// changed. Applying one (adapters/lora_merger.h) adds scale * (alpha / rank) * up @ down to the
// target weight.
#pragma once
#include <torch/nn/module.h>
#include <torch/types.h>

#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "io/lora_key_map.h"
#include "io/weight_layout.h"

namespace diffuse::adapters {

// A network adapters may patch, and how files name it.
struct Network {
  Network() = default;
  Network(io::lora::NetworkNames names, torch::nn::Module* module,
          io::WeightLayout file_layout = {})
      : names(std::move(names)), module(module), file_layout(std::move(file_layout)) {}
  io::lora::NetworkNames names;
  torch::nn::Module* module = nullptr;  // not owned; must outlive what was built from it
  // Another naming of the module's weights that LoRA files may use (BFL's FLUX names, without
  // a checkpoint prefix): a pair on such a file's module, fused ones included, patches the rows
  // each parameter takes of it. Empty: the module's own names only.
  io::WeightLayout file_layout;
  // More names LoRA files give modules of file_layout: file module -> file_layout module
  // (XLabs' "double_blocks.0.processor.qkv_lora1" is BFL's "double_blocks.0.img_attn.qkv").
  std::map<std::string, std::string> module_aliases;
};

struct LoraOptions {
  // peft's LoraConfig (lora_alpha, r) for files that store no per-pair alpha, as peft saves
  // them: factor = alpha / r. Unset: the file's "lora_alpha" / "lora_rank" metadata, else
  // alpha = each pair's rank (factor 1).
  std::optional<double> alpha;
  std::optional<double> rank;
  // Tensors that match no weight of any network: a warning (in LoraAdapter::warnings) instead
  // of an error.
  bool lenient = false;
};

// One low-rank update of one weight.
struct LoraPair {
  std::string key;     // the file's name of the pair (for messages)
  size_t network = 0;  // index into the networks it was resolved against
  std::string param;   // parameter name in that network ("...to_q.weight")
  torch::Tensor up;    // [out, r] float32
  torch::Tensor down;  // [r, in * kh * kw] float32
  double factor = 1;   // alpha / rank
};

// A tensor that replaces a weight (peft files such as HiDream-E1-Full's carry some).
struct FullTensor {
  std::string key;
  size_t network = 0;
  std::string param;
  torch::Tensor value;  // shape of the parameter, the file's dtype
};

struct LoraAdapter {
  std::string source;  // file path or a name
  std::vector<LoraPair> pairs;
  std::vector<FullTensor> full;
  std::vector<std::string> warnings;  // lenient mode: what was skipped
  // Weights (per network name) the adapter changes, for reports.
  std::map<std::string, int64_t> touched;
};

// Reads a .safetensors LoRA file and resolves it against `networks`. IoError / FormatError
// (the safetensors reader's, e.g. a truncated file) or FormatError naming the file and key for:
// up/down rank mismatch, an update whose shape fits no target, NaN or infinite values, and
// (unless lenient) tensors that match nothing (the first few are listed). Nothing is changed.
LoraAdapter load_lora(const std::string& path, const std::vector<Network>& networks,
                      const LoraOptions& options = {});

// The same from tensors already in memory (tests, adapters built on the fly).
LoraAdapter make_lora(const std::map<std::string, torch::Tensor>& tensors,
                      const std::map<std::string, std::string>& metadata, const std::string& source,
                      const std::vector<Network>& networks, const LoraOptions& options = {});

// The part of an adapter that patches networks[network], renumbered as network 0: pipelines that
// load (or reload, with offload) each network on its own merge each part separately.
LoraAdapter select_network(const LoraAdapter& adapter, size_t network);

// One line for the user: "PATH (scale S): N weights, unet 12, text_encoder 4; warning: ...".
std::string describe(const LoraAdapter& adapter, const std::string& path, double scale);

// up @ down in float32, shaped like a weight of `shape` (linear [out, in] or conv
// [out, in, kh, kw]).
torch::Tensor lora_delta(const LoraPair& pair, c10::IntArrayRef shape);

}  // namespace diffuse::adapters
