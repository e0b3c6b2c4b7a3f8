// A denoising step's work, estimated from its network's size before it runs, to choose the
// CPU threads of a generation (device::threads_for_step_work).
#pragma once
#include <cstdint>

#include "models/unet2d_condition.h"

namespace diffuse::pipeline {

// FLOPs of one UNet forward over `batch` latents of latent_height x latent_width, from its
// config and parameter count: each weight runs once per position of its level (a level's share
// of the weights taken as its channels squared), and the self-attentions grow with the square
// of the positions. Within 20 % of the hand count for SD2.1-base and a tiny two-level UNet
// (test StepWork.*).
double unet_step_flops(const models::UNet2DConditionConfig& config, int64_t parameters,
                       int64_t batch, int64_t latent_height, int64_t latent_width);

}  // namespace diffuse::pipeline
