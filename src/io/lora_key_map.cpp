// LoRA key tables (see io/lora_key_map.h).
#include "io/lora_key_map.h"

#include <algorithm>
#include <cstdlib>
#include <map>
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
  // XLabs' x-flux LoRA processors: "<module>.processor.qkv_lora1.down.weight" (the pair's module
  // name keeps its "_lora1" / "_lora2", which tell the image stream's from the text's).
  for (bool down : {true, false}) {
    const std::string suffix = down ? ".down.weight" : ".up.weight";
    if (!ends_with(key, suffix) || key.size() <= suffix.size()) continue;
    const std::string prefix = key.substr(0, key.size() - suffix.size());
    const size_t at = prefix.rfind("_lora");
    if (at == std::string::npos || prefix.find('.', at) != std::string::npos ||
        prefix.rfind(".processor.", at) == std::string::npos)
      continue;
    *m = {prefix, down, "", false};
    return true;
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

// The original (LDM / single-file) name of every UNet module, derived from the diffusers names
// alone: how many resnets each block has, and whether it has attentions or a resampler, fix
// the numbering of input_blocks / output_blocks. kohya files from LDM-based trainers name
// modules this way ("lora_unet_input_blocks_4_1_transformer_blocks_0_attn1_to_q").
std::map<std::string, std::string> ldm_unet_names(const std::vector<std::string>& parameters) {
  struct Block {
    int resnets = 0;
    bool attentions = false, resampler = false;
  };
  std::map<int, Block> down, up;
  auto index_after = [](const std::string& s, const std::string& key) {
    const size_t at = s.find(key);
    return at == std::string::npos ? -1 : std::atoi(s.c_str() + at + key.size());
  };
  for (const auto& p : parameters) {
    for (auto [prefix, blocks] : {std::pair{"down_blocks.", &down}, std::pair{"up_blocks.", &up}}) {
      if (!starts_with(p, prefix)) continue;
      Block& b = (*blocks)[std::atoi(p.c_str() + std::string(prefix).size())];
      const int r = index_after(p, ".resnets.");
      if (r >= 0) b.resnets = std::max(b.resnets, r + 1);
      b.attentions = b.attentions || p.find(".attentions.") != std::string::npos;
      b.resampler = b.resampler || p.find("samplers.0.") != std::string::npos;
    }
  }
  // Where each block's layers start in input_blocks / output_blocks.
  std::map<int, int> down_first, up_first;
  int next = 1;  // input_blocks.0 is conv_in
  for (const auto& [i, b] : down) down_first[i] = next, next += b.resnets + (b.resampler ? 1 : 0);
  next = 0;
  for (const auto& [i, b] : up) up_first[i] = next, next += b.resnets;
  const std::vector<std::pair<std::string, std::string>> resnet_parts = {
      {"norm1", "in_layers.0"},  {"conv1", "in_layers.2"},  {"time_emb_proj", "emb_layers.1"},
      {"norm2", "out_layers.0"}, {"conv2", "out_layers.3"}, {"conv_shortcut", "skip_connection"}};
  const std::map<std::string, std::string> fixed = {{"conv_in", "input_blocks.0.0"},
                                                    {"time_embedding.linear_1", "time_embed.0"},
                                                    {"time_embedding.linear_2", "time_embed.2"},
                                                    {"conv_norm_out", "out.0"},
                                                    {"conv_out", "out.2"}};
  std::map<std::string, std::string> out;
  for (const auto& p : parameters) {
    if (!ends_with(p, ".weight")) continue;
    const std::string m = p.substr(0, p.size() - 7);
    if (fixed.count(m)) {
      out[m] = fixed.at(m);
      continue;
    }
    std::string ldm;
    // "<head>.resnets.<l>.<rest>" / ".attentions.<l>.<rest>" / ".downsamplers.0.conv" ...
    const bool is_down = starts_with(m, "down_blocks."), is_up = starts_with(m, "up_blocks.");
    const bool is_mid = starts_with(m, "mid_block.");
    if (!is_down && !is_up && !is_mid) continue;
    const int block = is_mid ? 0 : std::atoi(m.c_str() + (is_down ? 12 : 10));
    const int r = index_after(m, ".resnets."), a = index_after(m, ".attentions.");
    std::string rest;  // the part inside the resnet / attention
    if (r >= 0 || a >= 0) {
      const std::string key = r >= 0 ? ".resnets." : ".attentions.";
      const size_t cut = m.find('.', m.find(key) + key.size());
      rest = cut == std::string::npos ? "" : m.substr(cut + 1);
    }
    if (r >= 0)
      for (const auto& [ours, theirs] : resnet_parts)
        if (rest == ours) rest = theirs;
    if (is_mid) {
      if (r >= 0) ldm = "middle_block." + std::to_string(r == 0 ? 0 : 2) + "." + rest;
      if (a >= 0) ldm = "middle_block.1." + rest;
    } else if (m.find("samplers.0.conv") != std::string::npos) {
      const Block& b = (is_down ? down : up)[block];
      ldm = is_down ? "input_blocks." + std::to_string(down_first[block] + b.resnets) + ".0.op"
                    : "output_blocks." + std::to_string(up_first[block] + b.resnets - 1) + "." +
                          (b.attentions ? "2" : "1") + ".conv";
    } else if (r >= 0 || a >= 0) {
      const int layer = r >= 0 ? r : a;
      ldm = std::string(is_down ? "input_blocks." : "output_blocks.") +
            std::to_string((is_down ? down_first : up_first)[block] + layer) +
            (r >= 0 ? ".0." : ".1.") + rest;
    }
    if (!ldm.empty()) out[m] = ldm;
  }
  return out;
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
  if (names_.name != "unet") return;
  // kohya files may also use the original single-file names of the UNet's modules.
  for (const auto& [module, ldm] : ldm_unet_names(parameter_names)) {
    std::string flat = ldm;
    std::replace(flat.begin(), flat.end(), '.', '_');
    auto [it, inserted] = flat_.emplace(flat, module);
    if (!inserted && it->second != module) it->second.clear();
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
