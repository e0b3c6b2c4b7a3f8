// The UNet call of a denoising loop replayed from a device graph: a CUDA graph, or torch_npu's
// NPUGraph on Ascend (GenerationConfig::cuda_graph, --graph). The shapes of a generation do not
// change between steps, so the call is recorded once on static input tensors; each step copies its
// inputs in, replays, and copies the output out. The kernels are the eager call's, so the result is
// bit-identical to it.
#pragma once
#include <torch/types.h>

#include <optional>
#include <vector>

#include "device/device_graph.h"
#include "models/unet2d_condition.h"

namespace diffuse::accel {

class UNetGraph {
 public:
  torch::Tensor forward(models::UNet2DConditionModelImpl& unet, const torch::Tensor& sample,
                        const torch::Tensor& timestep, const torch::Tensor& context,
                        const models::UNetAddedConditions* added);
  // How often the call was recorded (1 for a generation; again when a shape changes).
  int captures() const { return captures_; }
  // Forgets the recording: the next call records again (a change the graph cannot see, such
  // as unmerged LoRA updates, whose scales are kernel arguments baked into the recording).
  void reset();

 private:
  bool fits(const models::UNet2DConditionModelImpl& unet, const torch::Tensor& sample,
            const torch::Tensor& timestep, const torch::Tensor& context,
            const models::UNetAddedConditions* added) const;

  // The recording reads the weights where they were: a network rebuilt or a weight replaced
  // (offload, a LoRA bound by replacement) records again.
  std::vector<const void*> weights_;
  const void* unet_ = nullptr;
  device::DeviceGraph graph_;
  torch::Tensor sample_, timestep_, context_, out_;
  std::optional<models::UNetAddedConditions> added_;
  int captures_ = 0;
};

}  // namespace diffuse::accel
