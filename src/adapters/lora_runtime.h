// Unmerged LoRA: each low-rank pair is attached to its layer (nn::Linear / nn::Conv2d), which
// adds scale * (alpha / rank) * up(down(x)) to its output at run time. The weights are never
// written, so adding, rescaling, removing or switching adapters off costs no weight traffic and
// the model without adapters is exactly the model loaded; each step pays two thin products per
// patched layer instead. Full tensors (weights an adapter replaces) and pairs whose layer has
// no run-time path (grouped convolutions, other padding modes) are merged into the weights by
// a LoraMerger kept alongside.
#pragma once
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "adapters/lora_applier.h"
#include "adapters/lora_merger.h"

namespace diffuse::adapters {

class LoraRuntime : public LoraApplier {
 public:
  explicit LoraRuntime(std::vector<Network> networks);
  ~LoraRuntime() override;  // detaches everything it attached

  int add(LoraAdapter adapter, double scale) override;
  void set_scale(int id, double scale) override;
  void remove(int id) override;
  void set_lora_enabled(bool enabled) override;
  void clear() override;
  std::vector<int> ids() const override;

  // Pairs attached to layers (run-time products), and pairs + full tensors merged instead.
  size_t attached_pairs() const;
  size_t merged_weights() const { return merger_.patched_weights(); }

 private:
  struct Attached {
    torch::nn::Module* layer;
    torch::Tensor down, up;  // in the layer's dtype, on its device, shaped for it
    double factor;
  };
  struct Entry {
    int id = 0;
    std::vector<Attached> attached;
    double scale = 1;
    int merged_id = -1;  // in merger_, or -1
  };
  Entry& entry(int id);
  // Rebuilds the layers' update lists from entries_ (a few hundred small vectors).
  void reattach();

  std::vector<Network> networks_;
  std::vector<std::map<std::string, torch::nn::Module*>> layers_;  // per network, by module name
  LoraMerger merger_;
  std::vector<Entry> entries_;
  std::set<torch::nn::Module*> touched_;  // layers that ever got an update
  bool enabled_ = true;
  int next_id_ = 0;
};

}  // namespace diffuse::adapters
