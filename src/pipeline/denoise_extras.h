// What a denoising loop adds to its plain steps, for any family: the inpainting latents (a
// 9-channel UNet's extra input channels, or the kept region blended back after each step) and
// the ControlNets. The loops call these hooks; nothing here is specific to one pipeline file.
#pragma once
#include <torch/types.h>

#include <optional>

namespace diffuse::pipeline {

class ControlNetSteps;

struct InpaintLatents {
  torch::Tensor mask;  // [N, 1, h, w] binary, 1 = repaint (not doubled for guidance)
  // A dedicated inpainting network (UNet in_channels = latents + 1 + latents): its input is
  // cat([scaled latents, mask, masked_image_latents]) after scale_model_input.
  bool concat = false;
  torch::Tensor masked_image_latents;  // [N, C, h, w]
  // An ordinary network: after each step the kept region becomes the source's latents noised
  // to the next step's level (its own latents after the last step).
  torch::Tensor image_latents, noise;  // [N, C, h, w]

  // The denoiser's input channels for a (guidance-doubled when `guidance`) latent input.
  torch::Tensor network_input(const torch::Tensor& model_input, bool guidance) const;
  // The blend after a step: (1 - m) * known + m * latents, `known` being image_latents noised
  // to the next step's level by the family's forward process (DDPM add_noise, flow matching's
  // scale_noise), or image_latents itself after the last step.
  torch::Tensor blend(const torch::Tensor& latents, const torch::Tensor& known) const;
};

struct DenoiseExtras {
  std::optional<InpaintLatents> inpaint;
  const ControlNetSteps* controlnets = nullptr;
};

}  // namespace diffuse::pipeline
