// UniPC (Zhao et al., arXiv:2302.04867: multistep predictor UniP + corrector UniC) in its
// flow-matching form, the scheduler of HiDream-I1-Full: diffusers 0.34 UniPCMultistepScheduler
// with use_flow_sigmas, and hi_diffusers' FlowUniPCMultistepScheduler that HiDream's own
// pipeline uses. Data prediction (predict_x0) from flow_prediction outputs, x0 = x - sigma * v,
// B(h) = h (bh1) or e^h - 1 (bh2). Coefficients are computed with the same float32 tensor
// operations as the reference, so trajectories match it to float32 rounding.
#pragma once
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "schedulers/scheduler.h"
#include "schedulers/scheduler_config.h"

namespace diffuse::schedulers {

class FlowUniPCScheduler : public Scheduler {
 public:
  // pred_original_sample = x - sigma * v (what UniPC stores as its model output).
  StepOutput step(const torch::Tensor& model_output, const torch::Tensor& timestep,
                  const torch::Tensor& sample, const StepNoise& noise = StepNoise()) override;
  // (1 - sigma) * original + sigma * noise.
  torch::Tensor add_noise(const torch::Tensor& original, const torch::Tensor& noise,
                          const torch::Tensor& timesteps) override;

 protected:
  // Reads solver_order, prediction_type (flow_prediction; the class's default is
  // `default_prediction_type`), thresholding (false), predict_x0 (true), solver_type,
  // lower_order_final, disable_corrector, solver_p (null).
  FlowUniPCScheduler(const SchedulerConfig& config, const std::string& default_prediction_type);
  // Installs float64 sigmas (descending, one per step): int64 timesteps = trunc(sigma * N),
  // float32 sigmas with `last` appended; resets the multistep state.
  void install(const std::vector<double>& sigmas, double last, int n);

 private:
  torch::Tensor predictor(const torch::Tensor& sample, int order);
  // Corrects the sample the last predictor produced, with this step's model output.
  torch::Tensor corrector(const torch::Tensor& this_model_output, int order);

  int solver_order_;
  bool bh1_;
  bool lower_order_final_;
  std::set<int64_t> disable_corrector_;
  std::vector<torch::Tensor> model_outputs_;  // newest last; undefined until filled
  int lower_order_nums_ = 0;
  int this_order_ = 0;
  torch::Tensor last_sample_;
};

// diffusers' UniPCMultistepScheduler; only its flow mode (use_flow_sigmas true, prediction_type
// flow_prediction) is implemented: other configs are a ConfigError.
class UniPCMultistepScheduler : public FlowUniPCScheduler {
 public:
  // Also reads use_flow_sigmas, flow_shift, final_sigmas_type (zero | sigma_min) and the
  // use_*_sigmas flags (which must be false).
  explicit UniPCMultistepScheduler(const SchedulerConfig& config);
  const char* class_name() const override { return "UniPCMultistepScheduler"; }
  void set_timesteps(int num_inference_steps) override;

 private:
  double flow_shift_;
  bool final_sigma_min_;
};

// hi_diffusers' FlowUniPCMultistepScheduler: shift (overridable per call with set_shift, as
// HiDream's pipeline does with shift = e^mu), or use_dynamic_shifting with set_shift_mu.
class FlowUniPCMultistepScheduler : public FlowUniPCScheduler {
 public:
  // Also reads shift, use_dynamic_shifting and final_sigmas_type (zero only: hi_diffusers has
  // no alphas for "sigma_min").
  explicit FlowUniPCMultistepScheduler(const SchedulerConfig& config);
  const char* class_name() const override { return "FlowUniPCMultistepScheduler"; }
  void set_timesteps(int num_inference_steps) override;
  void set_shift_mu(std::optional<double> mu) override { mu_ = mu; }
  void set_shift(std::optional<double> shift) override { shift_override_ = shift; }

 private:
  double shift_;
  bool dynamic_shifting_;
  double sigma_max_, sigma_min_;  // bounds from the float32 training sigmas
  std::optional<double> mu_, shift_override_;
};

}  // namespace diffuse::schedulers
