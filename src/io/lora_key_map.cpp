// LoRA key tables (see io/lora_key_map.h).
#include "io/lora_key_map.h"

#include <algorithm>
#include <set>
#include <utility>

#include "diffuse/errors.h"
#include "io/string_affixes.h"

namespace diffuse::io::lora {
namespace {

void replace_all(std::string& s, const std::string& from, const std::string& to) {
  for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size()))
    s.replace(at, from.size(), to);
}

// Fixed suffixes of the two tensors of a pair, per naming style.
struct PairSuffix {
  const char* down;
  const char* up;
};
const PairSuffix kPairSuffixes[] = {
    {".lora_down.weight", ".lora_up.weight"},                            // kohya
    {".lora_A.weight", ".lora_B.weight"},                                // peft / diffusers
    {".lora.down.weight", ".lora.up.weight"},                            // older diffusers
    {".lora_linear_layer.down.weight", ".lora_linear_layer.up.weight"},  // diffusers text enc.
    {"_lora.down.weight", "_lora.up.weight"},  // diffusers attention processors (to_q_lora)
};

// Names of tensor kinds that belong to adapters this loader does not implement: rejected
// instead of being taken for full tensors.
const char* const kUnsupported[] = {"lora_magnitude_vector",
                                    "dora_scale",
                                    "hada_w",
                                    "hada_t",
                                    "lokr_w",
                                    "lokr_t",
                                    "lora_embedding_",
                                    ".lora_A.",
                                    ".lora_B.",
                                    ".lora_down.",
                                    ".lora_up.",
                                    ".lora.",
                                    "_lora."};

struct Match {
  std::string prefix;
  bool down = false;
  std::string adapter;  // peft adapter name ("" when the key has none)
  bool kohya_suffix = false;
};

// Recognises one tensor of a pair: "<prefix><suffix>" or peft's
// "<prefix>.lora_A.<adapter>.weight".
bool match_pair_key(const std::string& key, Match* m) {
  for (const auto& s : kPairSuffixes) {
    for (bool down : {true, false}) {
      const std::string suffix = down ? s.down : s.up;
      if (ends_with(key, suffix) && key.size() > suffix.size()) {
        *m = {key.substr(0, key.size() - suffix.size()), down, "", &s == &kPairSuffixes[0]};
        return true;
      }
    }
  }
  for (bool down : {true, false}) {
    const std::string mid = down ? ".lora_A." : ".lora_B.";
    size_t at = key.rfind(mid);
    if (at == std::string::npos || at == 0 || !ends_with(key, ".weight")) continue;
    std::string adapter = key.substr(at + mid.size());
    adapter.resize(adapter.size() - std::string(".weight").size());
    if (adapter.empty() || adapter.find('.') != std::string::npos) continue;
    *m = {key.substr(0, at), down, adapter, false};
    return true;
  }
  return false;
}

}  // namespace

FileKeys group_keys(const std::vector<std::string>& keys, const std::string& source) {
  auto fail = [&](const std::string& what) { throw FormatError(source + ": " + what); };
  std::map<std::string, PairKeys> pairs;
  std::set<std::string> adapters;
  std::vector<std::string> rest;
  for (const auto& key : keys) {
    Match m;
    if (!match_pair_key(key, &m)) {
      rest.push_back(key);
      continue;
    }
    if (!m.adapter.empty()) adapters.insert(m.adapter);
    PairKeys& p = pairs[m.prefix];
    p.prefix = m.prefix;
    // kohya flattens the module path; dotted prefixes with lora_down/up are module paths.
    p.kohya = m.kohya_suffix && m.prefix.find('.') == std::string::npos;
    std::string& slot = m.down ? p.down : p.up;
    if (!slot.empty())
      fail("tensors '" + slot + "' and '" + key + "' are both the " +
           (m.down ? "down (lora_A)" : "up (lora_B)") + " matrix of '" + m.prefix + "'");
    slot = key;
  }
  if (adapters.size() > 1)
    fail("the file holds several peft adapters ('" + *adapters.begin() + "', '" +
         *std::next(adapters.begin()) + "'); expected one adapter per file");

  FileKeys out;
  for (const auto& key : rest) {
    if (ends_with(key, ".alpha")) {
      auto it = pairs.find(key.substr(0, key.size() - 6));
      if (it == pairs.end())
        fail("alpha tensor '" + key + "' has no lora_down/lora_up (lora_A/lora_B) pair");
      it->second.alpha = key;
      continue;
    }
    for (const char* marker : kUnsupported)
      if (key.find(marker) != std::string::npos)
        fail("tensor '" + key +
             "' is of an adapter kind this loader does not support (expected LoRA "
             "lora_down/lora_up or lora_A/lora_B weights and alpha; DoRA, LoHa, LoKr, LoRA "
             "biases and embedding LoRA are not implemented)");
    out.full.push_back(key);
  }
  for (auto& [prefix, p] : pairs) {
    if (p.down.empty()) fail("'" + p.up + "' has no matching down (lora_A / lora_down) tensor");
    if (p.up.empty()) fail("'" + p.down + "' has no matching up (lora_B / lora_up) tensor");
    out.pairs.push_back(p);
  }
  return out;
}

NetworkNames unet_names() {
  return {"unet", {"unet."}, {"lora_unet_"}};
}
NetworkNames text_encoder_names() {
  return {"text_encoder", {"text_encoder."}, {"lora_te_", "lora_te1_"}};
}
NetworkNames text_encoder_2_names() {
  return {"text_encoder_2", {"text_encoder_2."}, {"lora_te2_"}};
}
NetworkNames transformer_names() {
  return {
      "transformer", {"transformer.", "diffusion_model.", ""}, {"lora_transformer_", "lora_unet_"}};
}

ModuleIndex::ModuleIndex(NetworkNames names, const std::vector<std::string>& parameter_names)
    : names_(std::move(names)) {
  for (const auto& p : parameter_names) {
    params_[p] = true;
    if (!ends_with(p, ".weight")) continue;
    std::string flat = p.substr(0, p.size() - 7);
    std::replace(flat.begin(), flat.end(), '.', '_');
    auto [it, inserted] = flat_.emplace(flat, p.substr(0, p.size() - 7));
    if (!inserted) it->second.clear();  // two modules flatten alike: kohya names are ambiguous
  }
}

std::string ModuleIndex::module_weight(const std::string& module) const {
  std::string m = module;
  // diffusers' attention-processor LoRA names the projections of the processor's owner.
  replace_all(m, ".processor.to_out", ".to_out.0");
  replace_all(m, ".processor.", ".");
  std::string weight = m + ".weight";
  return params_.count(weight) ? weight : std::string();
}

std::string ModuleIndex::pair_target(const PairKeys& pair, bool* ambiguous) const {
  if (ambiguous) *ambiguous = false;
  if (pair.kohya) {
    for (const auto& kp : names_.kohya_prefixes) {
      if (!starts_with(pair.prefix, kp)) continue;
      auto it = flat_.find(pair.prefix.substr(kp.size()));
      if (it == flat_.end()) continue;
      if (it->second.empty()) {
        if (ambiguous) *ambiguous = true;
        return "";
      }
      return it->second + ".weight";
    }
    return "";
  }
  for (const auto& pp : names_.peft_prefixes) {
    if (!starts_with(pair.prefix, pp)) continue;
    std::string w = module_weight(pair.prefix.substr(pp.size()));
    if (!w.empty()) return w;
  }
  return "";
}

std::string ModuleIndex::full_target(const std::string& key) const {
  for (const auto& pp : names_.peft_prefixes) {
    if (!starts_with(key, pp)) continue;
    std::string name = key.substr(pp.size());
    replace_all(name, ".base_layer.", ".");  // peft keeps the wrapped layer's own weights here
    if (params_.count(name)) return name;
  }
  return "";
}

}  // namespace diffuse::io::lora
