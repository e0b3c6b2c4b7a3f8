// What the denoising loop calls instead of unet->forward: DeepCache, token merging or CUDA
// graph replay when the generation asks for them, exactly the plain forward when it does not.
#pragma once
#include <torch/types.h>

#include <memory>
#include <vector>

#include "accel/token_merging.h"
#include "accel/unet_graph.h"
#include "diffuse/pipeline.h"
#include "models/unet2d_condition.h"

namespace diffuse::accel {

// What needs no model (interval, ids >= 0, ratio): called with the rest of the generation
// config's checks, before anything loads.
void validate_accel_config(const GenerationConfig& config);
// Everything, against this UNet's config (ids in range, layer names). InvalidArgument naming
// the field, the value and what is expected.
void validate_accel_config(const GenerationConfig& config,
                           const models::UNet2DConditionConfig& unet);

class UNetAccelerator {
 public:
  // `steps`: the iterations of this run's denoising loop; `seed`: the run's seed (token
  // merging's random destinations). Validates as above.
  // `graph`: where config.cuda_graph keeps its recording across generations (a pipeline's
  // own, so that the next image of the same shapes replays without recording again); null =
  // one of its own for this run.
  UNetAccelerator(const GenerationConfig& config, const models::UNet2DConditionConfig& unet,
                  int64_t steps, uint64_t seed, UNetGraph* graph = nullptr);

  bool deep_cache() const { return deep_cache_.has_value(); }
  bool token_merging() const { return tome_ != nullptr; }
  // Whether loop iteration `step` runs the whole UNet (always, without DeepCache).
  bool full_step(int64_t step) const;

  torch::Tensor forward(models::UNet2DConditionModelImpl& unet, int64_t step,
                        const torch::Tensor& sample, const torch::Tensor& timestep,
                        const torch::Tensor& context,
                        const models::UNetAddedConditions* added = nullptr,
                        const models::UNetControlResiduals* control = nullptr);

 private:
  std::optional<models::UNetDeepCache> deep_cache_;
  std::vector<bool> full_;
  std::unique_ptr<TokenMerging> tome_;
  std::unique_ptr<UNetGraph> own_graph_;
  UNetGraph* graph_ = nullptr;
};

}  // namespace diffuse::accel
