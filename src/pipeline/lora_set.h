// The LoRA adapters of a pipeline, swappable between generations without reloading the model.
//
// It keeps which files are wanted at which scales, each file once as read and checked (by
// path), and per network a merger (adapters/lora_merger.h) bound to the module currently
// loaded. Changing the wanted list re-patches only the weights of the adapters that changed,
// from the kept originals: an adapter removed again leaves its weights bit-identical to
// before, and no adapter left means the exact original model. A network rebuilt from its file
// (offload) is patched again when it is bound.
#pragma once
#include <torch/nn/module.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "adapters/lora.h"
#include "adapters/lora_applier.h"
#include "diffuse/pipeline.h"
#include "io/lora_key_map.h"

namespace diffuse::pipeline {

class LoraSet {
 public:
  // The networks adapters may patch, in the order files are resolved against them. Unmerged:
  // the updates are products added at run time (adapters/lora_runtime.h) instead of written
  // into the weights (adapters/lora_merger.h).
  explicit LoraSet(std::vector<io::lora::NetworkNames> networks, bool unmerged = false);
  void set_unmerged(bool unmerged);  // before anything is bound

  // Whether some file of `wanted` has not been read yet (then set() needs every module).
  bool needs_reading(const std::vector<LoraSpec>& wanted) const;
  // Makes `wanted` the adapters in effect. `modules` has one entry per network (nullptr when
  // that network is not loaded now; all must be loaded when needs_reading()). Files are read
  // and checked first (IoError / FormatError naming file and key; InvalidArgument for a scale
  // that is not finite): on any error nothing changes. A file listed twice counts once, at
  // the sum of its scales. Then every loaded network is patched. Returns the seconds spent.
  double set(const std::vector<LoraSpec>& wanted, bool lenient,
             const std::vector<torch::nn::Module*>& modules);
  // A network just (re)built from its file: binds it and merges the wanted adapters into it.
  void bind(size_t network, torch::nn::Module& module);
  // A network about to be freed: drops its merger (and the kept originals with it).
  void unbind(const torch::nn::Module* module);

  bool empty() const { return wanted_.empty(); }
  bool unmerged() const { return unmerged_; }
  const std::vector<LoraSpec>& wanted() const { return wanted_; }
  // One line per wanted adapter: path, scale, weights it changes per network, and warnings.
  std::vector<std::string> report() const;

 private:
  struct Bound {
    const torch::nn::Module* module = nullptr;
    std::unique_ptr<adapters::LoraApplier> applier;
    struct Applied {
      int id;
      double scale;
    };
    std::map<std::string, Applied> applied;  // by path
  };
  // Brings a bound network's merger to the wanted list: removes, rescales, adds.
  void sync(size_t network);
  adapters::LoraAdapter part(const std::string& path, size_t network) const;

  std::vector<io::lora::NetworkNames> networks_;
  std::vector<LoraSpec> wanted_;
  std::map<std::string, adapters::LoraAdapter> files_;  // read and resolved, by path
  std::vector<Bound> bound_;
  bool unmerged_ = false;
};

}  // namespace diffuse::pipeline
