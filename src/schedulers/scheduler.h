// The Scheduler interface: one class per diffusers scheduler (DDIM, PNDM, Euler, Euler
// ancestral, DPM-Solver++ multistep, LMS, and the flow-matching Euler / LCM / HiDream flash
// Euler / UniPC), each built from a scheduler_config.json exactly like diffusers' `from_config`
// (unknown keys ignored, missing keys take that class's defaults) and matching diffusers 0.30.3
// (flow matching: 0.34.0 and HiDream's hi_diffusers) numerically.
//
// Usage (as the diffusers pipelines do):
//   auto s = make_scheduler(config);  s->set_timesteps(steps);
//   latents *= s->init_noise_sigma();
//   for (t : s->timesteps()) { x = s->scale_model_input(latents, t); ...;
//                               latents = s->step(model_out, t, latents).prev_sample; }
// Flow-matching pipelines with resolution-dependent shifting call s->set_shift_mu(mu) (or
// set_shift) before set_timesteps (diffusers' set_timesteps(steps, mu=mu)).
// Per-step state (PNDM's ets, DPM's model outputs, LMS derivatives, the step index) lives in
// the object; set_timesteps resets it. Schedules stay on the CPU; step/add_noise/
// scale_model_input work on any device and any latent shape and return tensors on the
// sample's device.
#pragma once
#include <ATen/core/Generator.h>
#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace diffuse::io {
class JsonConfig;
}

namespace diffuse::schedulers {

// Noise for stochastic steps (Euler ancestral, DDIM with eta > 0, SDE DPM-Solver): `noise`
// is used as-is when defined, else it is drawn on the CPU from `generator` (or the default
// generator) with the model output's shape and moved to its device, as diffusers'
// randn_tensor does for a CPU generator.
struct StepNoise {
  torch::Tensor noise;
  std::optional<at::Generator> generator;

  static StepNoise from_tensor(torch::Tensor n) { return StepNoise{std::move(n), std::nullopt}; }
  static StepNoise from_generator(at::Generator g) {
    return StepNoise{torch::Tensor(), std::move(g)};
  }
};

struct StepOutput {
  torch::Tensor prev_sample;
  torch::Tensor pred_original_sample;  // undefined for schedulers that have none (PNDM, DPM)
};

class Scheduler {
 public:
  virtual ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // The diffusers class name, e.g. "EulerDiscreteScheduler".
  virtual const char* class_name() const = 0;

  // Computes the inference schedule and resets all per-step state. InvalidArgument if
  // num_inference_steps < 1 or > num_train_timesteps (or too few for PNDM's Runge-Kutta warm-up).
  virtual void set_timesteps(int num_inference_steps) = 0;

  // The schedule (CPU): int64 for DDIM/PNDM/DPM, float32 for the Euler family, LMS and flow
  // matching. Empty until set_timesteps.
  const torch::Tensor& timesteps() const { return timesteps_; }
  // float32 sigmas (CPU) of sigma-based schedulers (num_inference_steps + 1 entries), else
  // undefined.
  const torch::Tensor& sigmas() const { return sigmas_; }
  // float32 [num_train_timesteps], exactly as diffusers computes it; undefined for the
  // flow-matching schedulers, which have no alphas.
  const torch::Tensor& alphas_cumprod() const { return alphas_cumprod_; }

  // Factor for the initial noise (diffusers' init_noise_sigma).
  virtual double init_noise_sigma() const { return 1.0; }

  // Scales the denoiser input for `timestep` (a 0-d or one-element tensor from timesteps()).
  virtual torch::Tensor scale_model_input(const torch::Tensor& sample,
                                          const torch::Tensor& timestep) {
    return sample;
  }

  // One denoising step from `timestep` to the next one of the schedule.
  virtual StepOutput step(const torch::Tensor& model_output, const torch::Tensor& timestep,
                          const torch::Tensor& sample, const StepNoise& noise = StepNoise()) = 0;

  // Noises `original` to `timesteps` (one per batch element, or one for all), as diffusers'
  // add_noise; used by img2img with the first timestep of the truncated schedule.
  virtual torch::Tensor add_noise(const torch::Tensor& original, const torch::Tensor& noise,
                                  const torch::Tensor& timesteps) = 0;

  // diffusers' scheduler.order (1 for all schedulers here); img2img slices
  // timesteps()[t_start * order:].
  int order() const { return 1; }
  int num_inference_steps() const { return num_inference_steps_; }
  int64_t num_train_timesteps() const { return num_train_timesteps_; }

  // img2img: the index of the first step that will run (diffusers' set_begin_index). Used by
  // the step-index based schedulers (Euler family, LMS, DPM); harmless for the others.
  void set_begin_index(int64_t begin_index) { begin_index_ = begin_index; }
  std::optional<int64_t> begin_index() const { return begin_index_; }
  std::optional<int64_t> step_index() const { return step_index_; }

  // DDIM's eta (the weight of the noise added per step); other schedulers ignore it, like the
  // diffusers pipelines, which pass eta only to schedulers whose step accepts it.
  virtual void set_eta(double eta) {}

  // The `mu` that diffusers' flow-matching set_timesteps(n, mu=mu) takes (the pipelines compute
  // it from the image sequence length): kept for every later set_timesteps. Used by schedulers
  // with use_dynamic_shifting (InvalidArgument from set_timesteps if they have none); ignored
  // by all others, as diffusers ignores it when dynamic shifting is off.
  virtual void set_shift_mu(std::optional<double> mu) {}
  // A static shift that replaces the config's for later set_timesteps calls (diffusers'
  // flow-matching set_shift, hi_diffusers' set_timesteps(n, shift=...)); nullopt restores the
  // config's. Ignored by schedulers without a static shift.
  virtual void set_shift(std::optional<double> shift) {}

  // Whether step() draws noise (Euler ancestral, DDIM with eta > 0, SDE variants), so the
  // pipeline knows to hand it a generator or recorded noise.
  virtual bool is_stochastic() const { return false; }

 protected:
  Scheduler(std::string source, torch::Tensor alphas_cumprod);
  // For schedulers without alphas (flow matching): alphas_cumprod() stays undefined.
  Scheduler(std::string source, int64_t num_train_timesteps);

  // InvalidArgument unless 1 <= n <= num_train_timesteps.
  void check_num_inference_steps(int n) const;
  // InvalidArgument if set_timesteps has not been called.
  void require_timesteps(const char* what) const;
  // Resets the per-step index state (set_timesteps calls this).
  void reset_step_index() {
    step_index_.reset();
    begin_index_.reset();
  }

  // Position of `timestep` in the schedule (the second match if it occurs twice, as diffusers
  // does for img2img). If absent: the last index when `missing_is_last` (DPM), else
  // InvalidArgument.
  int64_t index_for_timestep(const torch::Tensor& timestep, bool missing_is_last = false) const;
  // Sets step_index_ from begin_index_ or from the timestep, if not set yet.
  void init_step_index(const torch::Tensor& timestep, bool missing_is_last = false);
  // The sigma index used by add_noise for each entry of `timesteps` (diffusers' rule:
  // begin_index unset -> look each timestep up; else the current step or begin index).
  std::vector<int64_t> noise_step_indices(const torch::Tensor& timesteps,
                                          bool missing_is_last = false) const;
  // sigmas_[index] / alphas_cumprod_[t] as the float32 values the tensors hold.
  float sigma_at(int64_t index) const;
  float alpha_cumprod_at(int64_t t) const;

  std::string source_;  // the config file, for error messages
  int64_t num_train_timesteps_ = 0;
  torch::Tensor alphas_cumprod_;
  torch::Tensor timesteps_;
  torch::Tensor sigmas_;
  int num_inference_steps_ = 0;
  std::optional<int64_t> step_index_;
  std::optional<int64_t> begin_index_;
};

// Builds the scheduler named by the config's "_class_name". ConfigError naming the file and
// key for an unknown class or bad values.
std::unique_ptr<Scheduler> make_scheduler(const io::JsonConfig& config);
// Builds scheduler `name` (ddim|pndm|euler|euler_a|dpmpp_2m|lms, a flow-matching short name
// flow_euler|flow_lcm|flash_flow_euler|unipc_flow|flow_unipc, or a diffusers / hi_diffusers
// class name)
// from another scheduler's config, like diffusers' `NewClass.from_config(old.config)`: keys
// the new class does not know are ignored, missing ones take its defaults. "dpmpp_2m" also
// selects algorithm_type dpmsolver++ with solver_order 2, "unipc_flow" use_flow_sigmas with
// prediction_type flow_prediction. ConfigError for an unknown name.
std::unique_ptr<Scheduler> make_scheduler(const std::string& name,
                                          const io::JsonConfig& base_config);
// The short names of the noise-prediction (DDPM-family) schedulers that Stable Diffusion models
// can use.
std::vector<std::string> scheduler_names();
// The short names of the flow-matching schedulers (HiDream, Flux, SD3 models), kept apart
// because they do not fit models trained on a DDPM noise schedule.
std::vector<std::string> flow_scheduler_names();

}  // namespace diffuse::schedulers
