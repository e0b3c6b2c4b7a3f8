// Key-mapping tables for LoRA files: which tensors of a file form one low-rank pair, and which
// module of which network a pair (or a full tensor) belongs to. Two families of names exist:
//   peft / diffusers: "<prefix><module>.lora_A[.<adapter>].weight" / "lora_B", optional
//     "<module>.alpha"; the prefix names the network ("unet.", "text_encoder.", or nothing
//     when a file holds one network, as HiDream-E1-Full's does). Older diffusers files write
//     "<module>.lora.down.weight", "...processor.to_q_lora.down.weight" or
//     "...q_proj.lora_linear_layer.down.weight". Any other tensor is a full tensor that
//     replaces the weight of that name (E1-Full's "reload keys").
//   kohya / A1111: "lora_unet_<module with '_' for '.'>.lora_down.weight" / "lora_up.weight" /
//     ".alpha"; text encoders "lora_te_" (SD1/2), "lora_te1_" / "lora_te2_" (SDXL).
// The tables only work on names; shapes and values are checked by adapters/lora.
#pragma once
#include <map>
#include <string>
#include <vector>

namespace diffuse::io::lora {

// One low-rank pair as the file names it.
struct PairKeys {
  std::string prefix;  // the key up to the LoRA suffix ("lora_unet_..._to_q", "unet....to_q")
  std::string down;    // full key of the down / lora_A tensor [r, in(, kh, kw)]
  std::string up;      // full key of the up / lora_B tensor [out, r(, 1, 1)]
  std::string alpha;   // full key of the scalar alpha, or "" when the file has none
  bool kohya = false;  // named in kohya's flattened style
};

struct FileKeys {
  std::vector<PairKeys> pairs;    // sorted by prefix
  std::vector<std::string> full;  // every tensor that is not part of a pair
};

// Groups the keys of a LoRA file. FormatError naming `source` and the key for: a down tensor
// without its up tensor (or the reverse), an alpha without a pair, tensor kinds this loader does
// not implement (DoRA magnitudes, LoHa / LoKr, LoRA biases, embedding LoRA), and peft files that
// hold more than one adapter name.
FileKeys group_keys(const std::vector<std::string>& keys, const std::string& source);

// How files name one network.
struct NetworkNames {
  std::string name;                         // "unet", "text_encoder", "transformer", ...
  std::vector<std::string> peft_prefixes;   // e.g. {"unet."}; "" = bare module names
  std::vector<std::string> kohya_prefixes;  // e.g. {"lora_unet_"}
};

// The standard names of the networks diffuse loads.
NetworkNames unet_names();
NetworkNames text_encoder_names();    // SD1/2 text encoder, SDXL's first
NetworkNames text_encoder_2_names();  // SDXL's second text encoder
NetworkNames transformer_names();     // HiDream / DiT: bare names, "transformer.", "lora_unet_"

// Resolves file names to module names of one network, given that network's parameter names.
class ModuleIndex {
 public:
  ModuleIndex(NetworkNames names, const std::vector<std::string>& parameter_names);
  const NetworkNames& names() const { return names_; }

  // The parameter ("<module>.weight") that a pair's prefix addresses, or "" when the prefix
  // belongs to another network or to no module of this one. `ambiguous` is set when a kohya
  // name flattens two modules to the same string.
  std::string pair_target(const PairKeys& pair, bool* ambiguous = nullptr) const;
  // The parameter a full tensor replaces ("<prefix><module>[.base_layer].weight"), or "".
  std::string full_target(const std::string& key) const;

 private:
  std::string module_weight(const std::string& module) const;
  NetworkNames names_;
  std::map<std::string, bool> params_;       // parameter names (value unused)
  std::map<std::string, std::string> flat_;  // kohya-flattened module -> module ("" = ambiguous)
};

}  // namespace diffuse::io::lora
