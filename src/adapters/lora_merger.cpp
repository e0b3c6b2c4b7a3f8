// Merged LoRA (see adapters/lora_merger.h).
#include "adapters/lora_merger.h"

#include <torch/torch.h>

#include <algorithm>
#include <set>

#include "diffuse/errors.h"
#include "io/safetensors.h"
#include "nn/layers.h"

namespace diffuse::adapters {

LoraMerger::LoraMerger(std::vector<Network> networks) : networks_(std::move(networks)) {
  for (const auto& n : networks_) {
    if (!n.module) throw InvalidArgument("LoRA: network '" + n.names.name + "' is null");
    std::map<std::string, torch::Tensor> params;
    for (const auto& p : n.module->named_parameters(/*recurse=*/true))
      params.emplace(p.key(), p.value());
    params_.push_back(std::move(params));
  }
}

int LoraMerger::add(const std::string& path, double scale, const LoraOptions& options) {
  return add(load_lora(path, networks_, options), scale);
}

int LoraMerger::add(LoraAdapter adapter, double scale) {
  for (const auto& p : adapter.pairs)
    if (p.network >= networks_.size() || !params_[p.network].count(p.param))
      throw InvalidArgument("LoRA " + adapter.source + ": pair '" + p.key +
                            "' was resolved against other networks than this merger's");
  auto shared = std::make_shared<const LoraAdapter>(std::move(adapter));
  const int id = next_id_++;
  transact(weights_of(*shared), [&] { entries_.push_back({id, shared, scale}); });
  return id;
}

void LoraMerger::set_scale(int id, double scale) {
  const auto keys = weights_of(adapter(id));
  transact(keys, [&] {
    for (auto& e : entries_)
      if (e.id == id) e.scale = scale;
  });
}

void LoraMerger::remove(int id) {
  const auto keys = weights_of(adapter(id));
  transact(keys, [&] {
    entries_.erase(std::remove_if(entries_.begin(), entries_.end(),
                                  [&](const Entry& e) { return e.id == id; }),
                   entries_.end());
  });
}

void LoraMerger::set_lora_enabled(bool enabled) {
  // Every weight an adapter names, not only those patched now: a weight with low-rank pairs
  // only went back to its original (and left originals_) when the updates were switched off,
  // and must be patched again when they are switched on.
  std::set<WeightKey> keys;
  for (const auto& kv : originals_) keys.insert(kv.first);
  for (const auto& e : entries_)
    for (const auto& k : weights_of(*e.adapter)) keys.insert(k);
  transact({keys.begin(), keys.end()}, [&] { lora_enabled_ = enabled; });
}

void LoraMerger::clear() {
  std::vector<WeightKey> keys;
  for (const auto& kv : originals_) keys.push_back(kv.first);
  transact(keys, [&] { entries_.clear(); });
}

const LoraAdapter& LoraMerger::adapter(int id) const {
  for (const auto& e : entries_)
    if (e.id == id) return *e.adapter;
  throw InvalidArgument("LoRA: no adapter with id " + std::to_string(id) + " is loaded");
}

std::vector<int> LoraMerger::ids() const {
  std::vector<int> out;
  for (const auto& e : entries_) out.push_back(e.id);
  return out;
}

torch::Tensor& LoraMerger::param(const WeightKey& k) {
  return params_[k.first].at(k.second);
}

std::vector<LoraMerger::WeightKey> LoraMerger::weights_of(const LoraAdapter& a) const {
  std::set<WeightKey> keys;
  for (const auto& p : a.pairs) keys.insert({p.network, p.param});
  for (const auto& f : a.full) keys.insert({f.network, f.param});
  return {keys.begin(), keys.end()};
}

template <class F>
void LoraMerger::transact(const std::vector<WeightKey>& keys, F change) {
  const auto saved_entries = entries_;
  const bool saved_enabled = lora_enabled_;
  change();
  try {
    repatch(keys);
  } catch (...) {
    entries_ = saved_entries;
    lora_enabled_ = saved_enabled;
    repatch(keys);  // the previous state, from the kept originals
    throw;
  }
}

void LoraMerger::repatch(const std::vector<WeightKey>& keys) {
  // Inference tensors (models loaded under InferenceMode) may only be written inside it;
  // ordinary parameters may be written there too.
  c10::InferenceMode guard;
  // Convolutions' packed weight copies follow the new values (inference tensors count no
  // versions that would tell them).
  std::set<size_t> touched;
  for (const auto& key : keys) touched.insert(key.first);
  for (size_t n : touched) nn::drop_packed_weights(*networks_[n].module);
  struct Contribution {
    const LoraPair* pair;
    double scale;
  };
  std::map<WeightKey, std::vector<Contribution>> pairs;
  std::map<WeightKey, const FullTensor*> full;
  const std::set<WeightKey> wanted(keys.begin(), keys.end());
  for (const auto& e : entries_) {
    for (const auto& f : e.adapter->full)
      if (wanted.count({f.network, f.param})) full[{f.network, f.param}] = &f;  // last one wins
    if (!lora_enabled_ || e.scale == 0) continue;
    for (const auto& p : e.adapter->pairs)
      if (wanted.count({p.network, p.param})) pairs[{p.network, p.param}].push_back({&p, e.scale});
  }
  for (const auto& key : keys) {
    torch::Tensor& w = param(key);
    // A weight still viewing its file mapping (a streamed model) gets storage of its own
    // first: written in place, it would live in copy-on-write pages that streaming drops.
    if (io::is_file_mapped(w)) w.set_data(w.clone());
    auto orig = originals_.find(key);
    const auto pit = pairs.find(key);
    const auto fit = full.find(key);
    if (pit == pairs.end() && fit == full.end()) {
      if (orig != originals_.end()) {
        w.copy_(orig->second);
        originals_.erase(orig);
      }
      continue;
    }
    if (orig == originals_.end())
      orig = originals_
                 .emplace(key, w.detach().to(torch::kCPU, /*non_blocking=*/false,
                                             /*copy=*/true))
                 .first;
    const torch::Tensor& base = fit != full.end() ? fit->second->value : orig->second;
    if (pit == pairs.end()) {
      w.copy_(base);
      continue;
    }
    // float32 accumulation on the weight's device, one cast at the end.
    auto acc = base.to(w.device(), torch::kFloat32, /*non_blocking=*/false, /*copy=*/true);
    for (const auto& c : pit->second) {
      LoraPair on_device = *c.pair;
      on_device.up = c.pair->up.to(w.device());
      on_device.down = c.pair->down.to(w.device());
      acc.add_(lora_delta(on_device, w.sizes()), c.scale * c.pair->factor);
    }
    w.copy_(acc);
  }
}

}  // namespace diffuse::adapters
