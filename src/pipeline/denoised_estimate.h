// The denoised estimate x0 of a step: what the latents would be if the denoiser's prediction
// were exact. Previews show it (x_t is mostly noise until the last steps) and an interrupted
// generation decodes it, as AUTOMATIC1111 does (its CFG denoiser keeps the last "denoised").
#pragma once
#include <torch/types.h>

#include <string>

namespace diffuse::pipeline {

// DDPM-family schedulers. `model_input` is the denoiser's input for timestep `t`
// (scheduler.scale_model_input of the latents: DDPM-scaled for every scheduler, sigma-based
// ones included), `model_output` the guided prediction, `prediction_type` the scheduler
// config's ("epsilon", "v_prediction" or "sample"). The noise level at a fractional timestep
// (Euler's interpolated schedules) is interpolated in sigma, as diffusers' Euler does.
// InvalidArgument for another prediction type or a timestep outside the training range.
torch::Tensor ddpm_denoised(const torch::Tensor& model_input, const torch::Tensor& model_output,
                            double t, const torch::Tensor& alphas_cumprod,
                            const std::string& prediction_type);

// The warning of a generation that StepAction::finish_now() ended after `steps_run` of `total`.
std::string interrupted_warning(int64_t steps_run, int64_t total);

// Flow matching (x_t = (1 - sigma) x0 + sigma noise, velocity = noise - x0): x0 = x_t - sigma v.
torch::Tensor flow_denoised(const torch::Tensor& latents, const torch::Tensor& velocity,
                            double sigma);

}  // namespace diffuse::pipeline
