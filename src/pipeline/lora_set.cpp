#include "pipeline/lora_set.h"

#include <c10/util/StringUtil.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <set>

#include "adapters/lora_merger.h"
#include "adapters/lora_runtime.h"

namespace diffuse::pipeline {

LoraSet::LoraSet(std::vector<io::lora::NetworkNames> networks, bool unmerged)
    : networks_(std::move(networks)), bound_(networks_.size()), unmerged_(unmerged) {}

void LoraSet::set_unmerged(bool unmerged) {
  for (const auto& b : bound_)
    if (b.applier) throw InvalidArgument("LoRA: the mode is chosen before adapters are applied");
  unmerged_ = unmerged;
}

bool LoraSet::needs_reading(const std::vector<LoraSpec>& wanted) const {
  for (const auto& w : wanted)
    if (!files_.count(w.path)) return true;
  return false;
}

double LoraSet::set(const std::vector<LoraSpec>& wanted_in, bool lenient,
                    const std::vector<torch::nn::Module*>& modules) {
  const auto t0 = std::chrono::steady_clock::now();
  if (modules.size() != networks_.size())
    throw InvalidArgument("LoRA: " + std::to_string(modules.size()) + " modules for " +
                          std::to_string(networks_.size()) + " networks");
  // One entry per file: a file listed twice is one adapter at the sum of its scales (the same
  // update, computed once).
  std::vector<LoraSpec> wanted;
  for (const auto& w : wanted_in) {
    if (!std::isfinite(w.scale))
      throw InvalidArgument("LoRA '" + w.path + "': scale must be a finite number, got " +
                            c10::str(w.scale));
    auto same = std::find_if(wanted.begin(), wanted.end(),
                             [&](const LoraSpec& kept) { return kept.path == w.path; });
    if (same == wanted.end())
      wanted.push_back(w);
    else
      same->scale += w.scale;
  }
  // Every new file is read and checked before anything changes.
  std::map<std::string, adapters::LoraAdapter> read;
  if (needs_reading(wanted)) {
    std::vector<adapters::Network> nets;
    for (size_t n = 0; n < networks_.size(); ++n) {
      if (!modules[n])
        throw InvalidArgument("LoRA: network '" + networks_[n].name +
                              "' must be loaded to read a new adapter");
      nets.push_back({networks_[n], modules[n]});
    }
    adapters::LoraOptions options;
    options.lenient = lenient;
    for (const auto& w : wanted)
      if (!files_.count(w.path) && !read.count(w.path))
        read.emplace(w.path, adapters::load_lora(w.path, nets, options));
  }
  for (auto& [path, adapter] : read) files_.emplace(path, std::move(adapter));
  wanted_ = std::move(wanted);
  // Files no longer wanted are forgotten: the cache holds what is in effect, nothing more.
  std::set<std::string> keep;
  for (const auto& w : wanted_) keep.insert(w.path);
  for (auto it = files_.begin(); it != files_.end();)
    it = keep.count(it->first) ? std::next(it) : files_.erase(it);

  for (size_t n = 0; n < networks_.size(); ++n) {
    if (!modules[n]) {
      bound_[n] = Bound{};
    } else if (bound_[n].module != modules[n]) {
      bind(n, *modules[n]);
    } else {
      sync(n);
    }
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

adapters::LoraAdapter LoraSet::part(const std::string& path, size_t network) const {
  return adapters::select_network(files_.at(path), network);
}

void LoraSet::bind(size_t network, torch::nn::Module& module) {
  Bound& b = bound_.at(network);
  b = Bound{};
  b.module = &module;
  std::vector<adapters::Network> nets{{networks_[network], &module}};
  if (unmerged_)
    b.applier = std::make_unique<adapters::LoraRuntime>(std::move(nets));
  else
    b.applier = std::make_unique<adapters::LoraMerger>(std::move(nets));
  sync(network);
}

void LoraSet::unbind(const torch::nn::Module* module) {
  for (auto& b : bound_)
    if (b.module == module) b = Bound{};
}

void LoraSet::sync(size_t network) {
  Bound& b = bound_[network];
  if (!b.applier) return;
  std::map<std::string, double> scales;
  for (const auto& w : wanted_) scales[w.path] = w.scale;
  for (auto it = b.applied.begin(); it != b.applied.end();) {
    if (scales.count(it->first)) {
      ++it;
      continue;
    }
    b.applier->remove(it->second.id);
    it = b.applied.erase(it);
  }
  for (const auto& w : wanted_) {
    auto it = b.applied.find(w.path);
    if (it != b.applied.end()) {
      if (it->second.scale != w.scale) b.applier->set_scale(it->second.id, w.scale);
      it->second.scale = w.scale;
      continue;
    }
    auto adapter = part(w.path, network);
    if (adapter.pairs.empty() && adapter.full.empty()) continue;
    b.applied[w.path] = {b.applier->add(std::move(adapter), w.scale), w.scale};
  }
}

std::vector<std::string> LoraSet::report() const {
  std::vector<std::string> lines;
  for (const auto& w : wanted_)
    lines.push_back(adapters::describe(files_.at(w.path), w.path, w.scale));
  return lines;
}

}  // namespace diffuse::pipeline
