// The denoising loop of the flow-matching pipelines (HiDream, FLUX): one velocity per
// scheduler timestep, a scheduler step, per-step timings, the step callback with the step's
// denoised estimate, cancellation and finish-now. What differs between families (how the
// velocity is computed and what a step records) comes in as the velocity function and the
// Step type, which must have the fields index, t, latents and denoised.
#pragma once
#include <ATen/CPUGeneratorImpl.h>
#include <torch/types.h>

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "diffuse/errors.h"
#include "diffuse/pipeline.h"
#include "pipeline/denoise_extras.h"
#include "pipeline/denoised_estimate.h"
#include "schedulers/scheduler.h"

namespace diffuse::pipeline {

struct FlowDenoiseOutcome {
  torch::Tensor latents;
  int steps_run = 0;
  bool interrupted = false;  // the callback asked to finish early: latents = its x0 estimate
  std::string warning;       // set when interrupted
};

struct FlowDenoiseInputs {
  uint64_t seed = 0;  // stochastic schedulers draw from seed + 1 (on the CPU)
  // Noise for stochastic schedulers, one per step that draws; drawn from the seed after that.
  const std::vector<torch::Tensor>* step_noise = nullptr;
  torch::Device device = torch::kCPU;                   // where recorded noise goes
  std::function<void(int step, int total)> begin_step;  // optional (DiT caches)
  // img2img: the schedule's first step that runs (the scheduler's begin index); steps are
  // counted from it.
  int64_t first_step = 0;
  // Inpainting with an ordinary transformer: after each step the kept region becomes the
  // source's latents noised to the next step's sigma (flow matching's scale_noise), its own
  // latents after the last step (diffusers' FluxInpaintPipeline). Same layout as the latents.
  const InpaintLatents* inpaint = nullptr;
};

template <class Step>
using FlowVelocity =
    std::function<torch::Tensor(const torch::Tensor& x, const torch::Tensor& t, Step& step)>;

// Runs every timestep of `scheduler` (set_timesteps already called) from `latents`; appends
// each step's seconds to `step_seconds`. Throws Cancelled when the callback cancels.
template <class Step>
FlowDenoiseOutcome flow_denoise(schedulers::Scheduler& scheduler, torch::Tensor latents,
                                const FlowDenoiseInputs& in, const FlowVelocity<Step>& velocity,
                                const std::function<StepAction(const Step&)>& on_step,
                                std::vector<double>& step_seconds) {
  using Clock = std::chrono::steady_clock;
  const auto all_timesteps = scheduler.timesteps();
  if (in.first_step > 0) scheduler.set_begin_index(in.first_step);
  const auto timesteps =
      all_timesteps.narrow(0, in.first_step, all_timesteps.size(0) - in.first_step);
  const int64_t total = timesteps.size(0);
  auto gen = at::detail::createCPUGenerator(in.seed + 1);
  size_t noise_used = 0;
  FlowDenoiseOutcome out;
  for (int64_t i = 0; i < total; ++i) {
    const auto step_start = Clock::now();
    auto t = timesteps[i];
    if (in.begin_step) in.begin_step(static_cast<int>(i), static_cast<int>(total));
    Step st;
    auto v = velocity(latents, t, st);
    auto noise = schedulers::StepNoise::from_generator(gen);
    if (scheduler.is_stochastic() && in.step_noise && noise_used < in.step_noise->size())
      noise = schedulers::StepNoise::from_tensor((*in.step_noise)[noise_used++].to(in.device));
    const auto before = latents;
    latents = scheduler.step(v, t, latents, noise).prev_sample;
    if (in.inpaint) {
      auto known = in.inpaint->image_latents.to(latents.device(), latents.scalar_type());
      if (i + 1 < total)
        known = scheduler.add_noise(known, in.inpaint->noise.to(latents.device()),
                                    timesteps[i + 1].reshape({1}));
      latents = in.inpaint->blend(latents, known);
    }
    step_seconds.push_back(std::chrono::duration<double>(Clock::now() - step_start).count());
    out.steps_run = static_cast<int>(i + 1);
    if (!on_step) continue;
    st.index = static_cast<int>(i);
    st.t = t;
    st.latents = latents;
    const auto& sigmas = scheduler.sigmas();
    const int64_t at = in.first_step + i;
    const double sigma = sigmas.defined() && sigmas.numel() > at
                             ? sigmas[at].item<double>()
                             : t.item<double>() / scheduler.num_train_timesteps();
    st.denoised = flow_denoised(before, v, sigma);
    const StepAction action = on_step(st);
    if (action.cancel())
      throw Cancelled("cancelled by the step callback at step " + std::to_string(i + 1) + "/" +
                      std::to_string(total));
    if (action.finish() && i + 1 < total) {
      latents = st.denoised;
      out.interrupted = true;
      out.warning = interrupted_warning(i + 1, total);
      break;
    }
  }
  out.latents = latents;
  return out;
}

}  // namespace diffuse::pipeline
