#include "schedulers/lms_discrete.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>

#include "schedulers/quadrature.h"

namespace diffuse::schedulers {

LMSDiscreteScheduler::LMSDiscreteScheduler(const SchedulerConfig& config)
    : SigmaScheduler(config, alphas_cumprod_from_betas(config.betas("linear", 0.0001, 0.02, false)),
                     config.timestep_spacing("linspace")),
      prediction_type_(config.prediction_type()) {
  options_.spacing = spacing_;
  options_.steps_offset = config.steps_offset();
  options_.karras = config.flag("use_karras_sigmas", false);
}

void LMSDiscreteScheduler::set_timesteps(int n) {
  check_num_inference_steps(n);
  install(make_sigma_schedule(alphas_cumprod_, n, options_), n);
  derivatives_.clear();
}

double LMSDiscreteScheduler::lms_coefficient(int order, int64_t t, int current_order) const {
  const double s_current = sigma_at(t - current_order);
  auto basis = [&](double tau) {
    double prod = 1.0;
    for (int k = 0; k < order; ++k) {
      if (k == current_order) continue;
      const double s_k = sigma_at(t - k);
      prod *= (tau - s_k) / (s_current - s_k);
    }
    return prod;
  };
  return integrate(basis, sigma_at(t), sigma_at(t + 1));
}

StepOutput LMSDiscreteScheduler::step(const torch::Tensor& model_output,
                                      const torch::Tensor& timestep, const torch::Tensor& sample,
                                      const StepNoise& noise) {
  require_timesteps("step");
  init_step_index(timestep);
  const int64_t i = *step_index_;
  const float sigma = sigma_at(i);
  auto pred_original = predict_original_sample(prediction_type_, sample, model_output, sigma);
  derivatives_.push_back((sample - pred_original) / static_cast<double>(sigma));
  if (derivatives_.size() > kOrder) derivatives_.pop_front();

  const int order = static_cast<int>(std::min<int64_t>(i + 1, kOrder));
  // Coefficient c pairs with the derivative c steps back.
  torch::Tensor update;
  for (int c = 0; c < order && c < static_cast<int>(derivatives_.size()); ++c) {
    auto term = derivatives_[derivatives_.size() - 1 - static_cast<size_t>(c)] *
                lms_coefficient(order, i, c);
    update = update.defined() ? update + term : term;
  }
  step_index_ = i + 1;
  return {sample + update, pred_original};
}

}  // namespace diffuse::schedulers
