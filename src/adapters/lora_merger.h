// Merged LoRA: adapters patched into the weights in place (no run-time cost), several at once,
// each with its own scale, changed or removed between generations without reloading.
//
// Every weight an adapter touches is kept once in its original form (a CPU copy), and a
// patched weight is always recomputed from it: W = original (or the last full tensor that
// replaces it) + sum_i scale_i * (alpha_i / rank_i) * up_i @ down_i, in float32, then cast to
// the weight's dtype. Removing an adapter therefore restores the exact original values (no
// subtraction, no drift), and a weight no adapter touches any more gets its original back.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "adapters/lora_applier.h"

namespace diffuse::adapters {

class LoraMerger : public LoraApplier {
 public:
  explicit LoraMerger(std::vector<Network> networks);
  // Restores nothing: call clear() to give the networks their original weights back.
  ~LoraMerger() override = default;

  const std::vector<Network>& networks() const { return networks_; }

  // Reads, checks and merges a file (see load_lora for the errors; on any error the weights are
  // unchanged). Returns the adapter's id.
  int add(const std::string& path, double scale, const LoraOptions& options = {});
  // Merges an adapter resolved against this merger's networks.
  int add(LoraAdapter adapter, double scale) override;
  void set_scale(int id, double scale) override;
  void remove(int id) override;
  // peft's disable_adapters() / enable_adapters(): the low-rank updates are switched off while
  // full tensors stay in place.
  void set_lora_enabled(bool enabled) override;
  // Every weight back to its exact original value; forgets all adapters.
  void clear() override;

  const LoraAdapter& adapter(int id) const;
  std::vector<int> ids() const override;
  // Weights currently differing from (or replacing) their originals' storage.
  size_t patched_weights() const { return originals_.size(); }

 private:
  struct Entry {
    int id;
    std::shared_ptr<const LoraAdapter> adapter;
    double scale;
  };
  using WeightKey = std::pair<size_t, std::string>;  // network index, parameter name

  torch::Tensor& param(const WeightKey& k);
  // Recomputes the weights in `keys` from the originals and the current adapters.
  void repatch(const std::vector<WeightKey>& keys);
  std::vector<WeightKey> weights_of(const LoraAdapter& a) const;
  // Runs `change` on the adapter list and repatches `keys`; restores the list and the weights
  // if anything throws.
  template <class F>
  void transact(const std::vector<WeightKey>& keys, F change);

  std::vector<Network> networks_;
  std::vector<std::map<std::string, torch::Tensor>> params_;  // per network, by name
  std::vector<Entry> entries_;
  std::map<WeightKey, torch::Tensor> originals_;  // CPU copies of touched weights
  bool lora_enabled_ = true;
  int next_id_ = 0;
};

}  // namespace diffuse::adapters
