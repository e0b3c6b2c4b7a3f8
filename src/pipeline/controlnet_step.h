// The ControlNets of one UNet generation, run at each denoising step: every net on its own
// control image with its scale and step window, residuals summed (diffusers'
// MultiControlNetModel), guess mode's conditional-only run with zeros for the unconditional
// branch. Shared by every UNet family (SD 1.x/2.x, SDXL).
#pragma once
#include <torch/types.h>

#include <string>
#include <vector>

#include "diffuse/pipeline.h"
#include "models/controlnet.h"
#include "models/unet2d_condition.h"

namespace diffuse::pipeline {

struct ControlNetStepUnit {
  models::ControlNetModelImpl* net = nullptr;
  torch::Tensor image;  // [1, 3, H, W] in [0, 1] on the net's device, at the generation's size
  double scale = 1, start = 0, end = 1;
};

class ControlNetSteps {
 public:
  ControlNetSteps(std::vector<ControlNetStepUnit> units, bool guess_mode)
      : units_(std::move(units)), guess_mode_(guess_mode) {}
  bool empty() const { return units_.empty(); }
  bool guess_mode() const { return guess_mode_; }

  // diffusers' per-step factor: scale x (1 - [i / n < start or (i + 1) / n > end]), n = the
  // loop's timesteps.
  static double step_scale(const ControlNetStepUnit& u, int64_t i, int64_t n);

  // Residuals for loop iteration i of n. `model_input`: the UNet's (scaled) latent input, CFG
  // batch [uncond; cond] when `guidance`; `cond`: the text states in the same order; `added`:
  // SDXL's conditioning in the same order. Guess mode with guidance runs the nets on the
  // conditional half only and gives zeros for the other. `trace` gets
  // step.i.controlnet.j.conditioning_scale.
  models::UNetControlResiduals run(
      int64_t i, int64_t n, const torch::Tensor& model_input, const torch::Tensor& timestep,
      const torch::Tensor& cond, const models::UNetAddedConditions* added, bool guidance,
      const std::function<void(const std::string&, const torch::Tensor&)>& trace) const;

 private:
  std::vector<ControlNetStepUnit> units_;
  bool guess_mode_ = false;
};

// InvalidArgument when a ControlNet's layout does not fit the UNet (block channels, layers per
// block, cross-attention width, SDXL conditioning) or its conditioning embedding's factor is
// not the VAE's, naming both values.
void check_controlnet_fits(const models::ControlNetConfig& net,
                           const models::UNet2DConditionConfig& unet, int64_t vae_factor,
                           const std::string& path);

// The GenerationConfig's ControlNet units, checked without loading anything (scales finite,
// 0 <= start < end <= 1, an image given); InvalidArgument naming the unit.
void validate_controlnet_units(const std::vector<ControlNetUnit>& units);

}  // namespace diffuse::pipeline
