// What a LoRA application offers, merged (adapters/lora_merger.h: the updates written into the
// weights) or unmerged (adapters/lora_runtime.h: extra low-rank products at run time): adapters
// added, rescaled, removed, switched off and cleared between generations without reloading.
#pragma once
#include <vector>

#include "adapters/lora.h"

namespace diffuse::adapters {

class LoraApplier {
 public:
  virtual ~LoraApplier() = default;
  // Applies an adapter resolved against this applier's networks; returns its id.
  virtual int add(LoraAdapter adapter, double scale) = 0;
  virtual void set_scale(int id, double scale) = 0;
  virtual void remove(int id) = 0;
  // peft's disable_adapters() / enable_adapters(): the low-rank updates are switched off while
  // full tensors stay in place.
  virtual void set_lora_enabled(bool enabled) = 0;
  // Every weight and layer back to its exact original state; forgets all adapters.
  virtual void clear() = 0;
  virtual std::vector<int> ids() const = 0;
};

}  // namespace diffuse::adapters
