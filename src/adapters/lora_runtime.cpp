// Unmerged LoRA (see adapters/lora_runtime.h).
#include "adapters/lora_runtime.h"

#include <torch/torch.h>

#include <algorithm>

#include "diffuse/errors.h"
#include "nn/layers.h"

namespace diffuse::adapters {
namespace {

const std::string kWeight = ".weight";

// The layer whose weight `param` is, when it can add a low-rank product at run time.
torch::nn::Module* runtime_layer(const std::map<std::string, torch::nn::Module*>& layers,
                                 const std::string& param) {
  if (param.size() <= kWeight.size() ||
      param.compare(param.size() - kWeight.size(), kWeight.size(), kWeight) != 0)
    return nullptr;
  const auto it = layers.find(param.substr(0, param.size() - kWeight.size()));
  if (it == layers.end()) return nullptr;
  if (dynamic_cast<nn::LinearImpl*>(it->second)) return it->second;
  if (auto* conv = dynamic_cast<nn::Conv2dImpl*>(it->second))
    if (nn::supports_low_rank(*conv)) return it->second;
  return nullptr;
}

std::vector<nn::LowRankUpdate>& updates_of(torch::nn::Module* layer) {
  if (auto* linear = dynamic_cast<nn::LinearImpl*>(layer)) return linear->low_rank;
  return dynamic_cast<nn::Conv2dImpl*>(layer)->low_rank;
}

}  // namespace

LoraRuntime::LoraRuntime(std::vector<Network> networks)
    : networks_(networks), merger_(std::move(networks)) {
  for (const auto& n : networks_) {
    std::map<std::string, torch::nn::Module*> layers;
    for (const auto& m : n.module->named_modules("", /*include_self=*/false))
      layers.emplace(m.key(), m.value().get());
    layers_.push_back(std::move(layers));
  }
}

LoraRuntime::~LoraRuntime() {
  for (auto* layer : touched_) updates_of(layer).clear();
}

int LoraRuntime::add(LoraAdapter adapter, double scale) {
  Entry e;
  e.id = next_id_++;
  e.scale = scale;
  LoraAdapter rest;  // merged: full tensors and pairs without a run-time path
  rest.source = adapter.source;
  rest.full = std::move(adapter.full);
  for (auto& p : adapter.pairs) {
    if (p.network >= layers_.size())
      throw InvalidArgument("LoRA " + adapter.source + ": pair '" + p.key +
                            "' was resolved against other networks than this one's");
    torch::nn::Module* layer = runtime_layer(layers_[p.network], p.param);
    if (!layer) {
      rest.pairs.push_back(std::move(p));
      continue;
    }
    // A handle, not a reference: named_parameters() returns a temporary dictionary.
    const torch::Tensor w = layer->named_parameters(/*recurse=*/false)["weight"];
    const auto to = torch::TensorOptions().dtype(w.scalar_type()).device(w.device());
    Attached a{layer, p.down.to(to), p.up.to(to), p.factor};
    if (w.dim() == 4) {  // a convolution: down as a conv weight, up as a 1x1 conv
      a.down = a.down.reshape({a.down.size(0), w.size(1), w.size(2), w.size(3)});
      a.up = a.up.reshape({a.up.size(0), a.up.size(1), 1, 1});
    }
    e.attached.push_back(std::move(a));
  }
  e.merged_id = rest.pairs.empty() && rest.full.empty() ? -1 : merger_.add(std::move(rest), scale);
  for (const auto& a : e.attached) touched_.insert(a.layer);
  entries_.push_back(std::move(e));
  reattach();
  return entries_.back().id;
}

LoraRuntime::Entry& LoraRuntime::entry(int id) {
  for (auto& e : entries_)
    if (e.id == id) return e;
  throw InvalidArgument("LoRA: no adapter with id " + std::to_string(id) + " is loaded");
}

void LoraRuntime::set_scale(int id, double scale) {
  Entry& e = entry(id);
  if (e.merged_id >= 0) merger_.set_scale(e.merged_id, scale);
  e.scale = scale;
  reattach();
}

void LoraRuntime::remove(int id) {
  const Entry& e = entry(id);
  if (e.merged_id >= 0) merger_.remove(e.merged_id);
  entries_.erase(
      std::remove_if(entries_.begin(), entries_.end(), [&](const Entry& x) { return x.id == id; }),
      entries_.end());
  reattach();
}

void LoraRuntime::set_lora_enabled(bool enabled) {
  merger_.set_lora_enabled(enabled);
  enabled_ = enabled;
  reattach();
}

void LoraRuntime::clear() {
  merger_.clear();
  entries_.clear();
  reattach();
}

std::vector<int> LoraRuntime::ids() const {
  std::vector<int> out;
  for (const auto& e : entries_) out.push_back(e.id);
  return out;
}

size_t LoraRuntime::attached_pairs() const {
  size_t n = 0;
  for (const auto& e : entries_) n += e.attached.size();
  return n;
}

void LoraRuntime::reattach() {
  for (auto* layer : touched_) updates_of(layer).clear();
  if (!enabled_) return;
  for (const auto& e : entries_) {
    if (e.scale == 0) continue;
    for (const auto& a : e.attached)
      updates_of(a.layer).push_back({a.down, a.up, e.scale * a.factor});
  }
}

}  // namespace diffuse::adapters
