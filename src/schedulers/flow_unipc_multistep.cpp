#include "schedulers/flow_unipc_multistep.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <sstream>

#include "diffuse/errors.h"
#include "io/json_config.h"
#include "schedulers/flow_match.h"
#include "schedulers/numpy_ops.h"
#include "schedulers/step_utils.h"

namespace diffuse::schedulers {
namespace {

// alpha = 1 - sigma, sigma and lambda = log(alpha) - log(sigma) of schedule entry i, as the
// 0-d float32 tensors the reference computes with.
struct FlowPoint {
  torch::Tensor alpha, sigma, lambda;
};

FlowPoint point(const torch::Tensor& sigmas, int64_t i) {
  auto sigma = sigmas[i];
  auto alpha = 1 - sigma;
  return {alpha, sigma, torch::log(alpha) - torch::log(sigma)};
}

struct UniCoefficients {
  torch::Tensor h_phi_1, b_h, r, b;
};

// The B(h) system of UniP/UniC for step size h (in lambda) and the ratios rks of the earlier
// steps: R[i] = rks^i, b[i] = h phi_{i+1}(h) i! / B(h), in the reference's operation order.
UniCoefficients coefficients(const torch::Tensor& h, std::vector<torch::Tensor> rks, int order,
                             bool bh1) {
  rks.push_back(torch::scalar_tensor(1.0, torch::kFloat32));
  const auto rk = torch::stack(rks);
  const auto hh = -h;  // data prediction
  const auto h_phi_1 = torch::expm1(hh);
  auto h_phi_k = h_phi_1 / hh - 1;
  int64_t factorial = 1;
  const auto b_h = bh1 ? hh : torch::expm1(hh);
  std::vector<torch::Tensor> r, b;
  for (int i = 1; i <= order; ++i) {
    r.push_back(torch::pow(rk, i - 1));
    b.push_back(h_phi_k * factorial / b_h);
    factorial *= i + 1;
    h_phi_k = h_phi_k / hh - 1.0 / static_cast<double>(factorial);
  }
  return {h_phi_1, b_h, torch::stack(r), torch::stack(b)};
}

float to_f32(double v) {
  return static_cast<float>(v);
}

}  // namespace

FlowUniPCScheduler::FlowUniPCScheduler(const SchedulerConfig& config,
                                       const std::string& default_prediction_type)
    : Scheduler(config.source(), config.num_train_timesteps()) {
  config.choice("prediction_type", default_prediction_type, {"flow_prediction"});
  const int64_t order = config.integer("solver_order", 2);
  if (order < 1 || order > 3) config.fail("solver_order", "must be 1, 2 or 3");
  solver_order_ = static_cast<int>(order);
  if (config.flag("thresholding", false))
    config.fail("thresholding", "true is not supported in flow mode");
  if (!config.flag("predict_x0", true)) config.fail("predict_x0", "false is not supported");
  // diffusers maps the DPM-Solver names onto bh2.
  bh1_ = config.choice("solver_type", "bh2", {"bh1", "bh2", "midpoint", "heun", "logrho"}) == "bh1";
  lower_order_final_ = config.flag("lower_order_final", true);
  if (config.json().has("disable_corrector")) {
    const auto& v = config.json().json().at("disable_corrector");
    if (!v.is_array()) config.fail("disable_corrector", "expected a list of step indices");
    for (const auto& x : v) {
      if (!x.is_number_integer()) config.fail("disable_corrector", "expected integer indices");
      disable_corrector_.insert(x.get<int64_t>());
    }
  }
  if (config.json().has("solver_p")) config.fail("solver_p", "is not supported (expected null)");
  model_outputs_.resize(static_cast<size_t>(solver_order_));
}

void FlowUniPCScheduler::install(const std::vector<double>& sigmas, double last, int n) {
  std::vector<int64_t> timesteps;
  std::vector<float> sigmas32;
  for (double s : sigmas) {
    // numpy float64 -> torch int64 truncates toward zero.
    timesteps.push_back(static_cast<int64_t>(s * static_cast<double>(num_train_timesteps_)));
    sigmas32.push_back(to_f32(s));
  }
  sigmas32.push_back(to_f32(last));
  timesteps_ = torch::tensor(timesteps, torch::kInt64);
  sigmas_ = torch::tensor(sigmas32, torch::kFloat32);
  num_inference_steps_ = n;
  model_outputs_.assign(static_cast<size_t>(solver_order_), torch::Tensor());
  lower_order_nums_ = 0;
  this_order_ = 0;
  last_sample_ = torch::Tensor();
  reset_step_index();
}

torch::Tensor FlowUniPCScheduler::predictor(const torch::Tensor& x, int order) {
  const int64_t k = *step_index_;
  const auto& m0 = model_outputs_.back();
  const auto t = point(sigmas_, k + 1), s0 = point(sigmas_, k);
  const auto h = t.lambda - s0.lambda;
  std::vector<torch::Tensor> rks, d1s;
  for (int i = 1; i < order; ++i) {
    const auto& mi = model_outputs_[model_outputs_.size() - 1 - static_cast<size_t>(i)];
    auto rk = (point(sigmas_, k - i).lambda - s0.lambda) / h;
    rks.push_back(rk);
    d1s.push_back((mi - m0) / rk);
  }
  const auto c = coefficients(h, rks, order, bh1_);
  const auto x_t = (t.sigma / s0.sigma) * x - (t.alpha * c.h_phi_1) * m0;
  const auto coef = t.alpha * c.b_h;
  if (d1s.empty()) return (x_t - coef * 0).to(x.scalar_type());
  // Order 2 uses rho = 0.5 instead of solving the 1x1 system, as the reference does.
  const auto rhos = order == 2
                        ? torch::full({1}, 0.5, x.options())
                        : at::linalg_solve(c.r.slice(0, 0, -1).slice(1, 0, -1), c.b.slice(0, 0, -1))
                              .to(x.device(), x.scalar_type());
  const auto pred_res = torch::einsum("k,bkc...->bc...", {rhos, torch::stack(d1s, 1)});
  return (x_t - coef * pred_res).to(x.scalar_type());
}

torch::Tensor FlowUniPCScheduler::corrector(const torch::Tensor& model_t, int order) {
  const int64_t k = *step_index_;
  const auto& m0 = model_outputs_.back();
  const auto& x = last_sample_;
  const auto t = point(sigmas_, k), s0 = point(sigmas_, k - 1);
  const auto h = t.lambda - s0.lambda;
  std::vector<torch::Tensor> rks, d1s;
  for (int i = 1; i < order; ++i) {
    const auto& mi = model_outputs_[model_outputs_.size() - 1 - static_cast<size_t>(i)];
    auto rk = (point(sigmas_, k - (i + 1)).lambda - s0.lambda) / h;
    rks.push_back(rk);
    d1s.push_back((mi - m0) / rk);
  }
  const auto c = coefficients(h, rks, order, bh1_);
  const auto rhos = order == 1 ? torch::full({1}, 0.5, x.options())
                               : at::linalg_solve(c.r, c.b).to(x.device(), x.scalar_type());
  const auto x_t = (t.sigma / s0.sigma) * x - (t.alpha * c.h_phi_1) * m0;
  const auto d1_t = model_t - m0;
  auto corr = rhos[-1] * d1_t;
  if (!d1s.empty())
    corr = torch::einsum("k,bkc...->bc...", {rhos.slice(0, 0, -1), torch::stack(d1s, 1)}) + corr;
  return (x_t - (t.alpha * c.b_h) * corr).to(x.scalar_type());
}

StepOutput FlowUniPCScheduler::step(const torch::Tensor& model_output,
                                    const torch::Tensor& timestep, const torch::Tensor& sample_in,
                                    const StepNoise& noise) {
  require_timesteps("step");
  init_step_index(timestep, /*missing_is_last=*/true);
  const int64_t k = *step_index_;
  const auto converted = sample_in - model_output * static_cast<double>(sigma_at(k));
  auto sample = sample_in;
  if (k > 0 && !disable_corrector_.count(k - 1) && last_sample_.defined())
    sample = corrector(converted, this_order_);
  model_outputs_.erase(model_outputs_.begin());
  model_outputs_.push_back(converted);
  const int64_t remaining = timesteps_.size(0) - k;
  const int order = lower_order_final_
                        ? static_cast<int>(std::min<int64_t>(solver_order_, remaining))
                        : solver_order_;
  this_order_ = std::min(order, lower_order_nums_ + 1);  // warm-up with lower orders
  last_sample_ = sample;
  auto prev = predictor(sample, this_order_);
  if (lower_order_nums_ < solver_order_) ++lower_order_nums_;
  step_index_ = k + 1;
  return {prev, converted};
}

torch::Tensor FlowUniPCScheduler::add_noise(const torch::Tensor& original,
                                            const torch::Tensor& noise,
                                            const torch::Tensor& timesteps) {
  auto indices = noise_step_indices(timesteps, /*missing_is_last=*/true);
  auto sigma =
      sigmas_.to(original.scalar_type()).index_select(0, torch::tensor(indices, torch::kInt64));
  sigma = per_sample(sigma, original, class_name());
  return (1 - sigma) * original + sigma * noise.to(original.device());
}

UniPCMultistepScheduler::UniPCMultistepScheduler(const SchedulerConfig& config)
    : FlowUniPCScheduler(config, "epsilon") {
  if (!config.flag("use_flow_sigmas", false))
    config.fail("use_flow_sigmas", "only the flow-matching mode (true) is implemented");
  for (const char* key : {"use_karras_sigmas", "use_exponential_sigmas", "use_beta_sigmas"})
    if (config.flag(key, false)) config.fail(key, "true is not supported with use_flow_sigmas");
  flow_shift_ = config.shift("flow_shift", 1.0);
  final_sigma_min_ =
      config.choice("final_sigmas_type", "zero", {"zero", "sigma_min"}) == "sigma_min";
}

void UniPCMultistepScheduler::set_timesteps(int n) {
  check_num_inference_steps(n);
  const auto N = static_cast<double>(num_train_timesteps_);
  // sigma = 1 - alpha on an ascending grid, shifted, then reversed without its final 0.
  const std::vector<double> alphas = np::linspace(1.0, 1.0 / N, n + 1);
  std::vector<double> sigmas;
  for (size_t i = alphas.size() - 1; i-- > 0;) {
    const double s = 1.0 - alphas[i + 1];
    sigmas.push_back(flow_shift_ * s / (1 + (flow_shift_ - 1) * s));
  }
  install(sigmas, final_sigma_min_ ? sigmas.back() : 0.0, n);
}

FlowUniPCMultistepScheduler::FlowUniPCMultistepScheduler(const SchedulerConfig& config)
    : FlowUniPCScheduler(config, "flow_prediction") {
  shift_ = config.shift("shift", 1.0);
  dynamic_shifting_ = config.flag("use_dynamic_shifting", false);
  config.choice("final_sigmas_type", "zero", {"zero"});
  // hi_diffusers bounds the schedule by its float32 training sigmas 1 - linspace(1, 1/N, N),
  // shifted with torch float32 arithmetic unless shifting is dynamic.
  const auto N = static_cast<double>(num_train_timesteps_);
  float hi = num_train_timesteps_ > 1 ? to_f32(1.0 - 1.0 / N) : 0.0f;
  float lo = 0.0f;
  if (!dynamic_shifting_) {
    const float a = to_f32(shift_), b = to_f32(shift_ - 1.0);
    hi = (a * hi) / (1.0f + b * hi);
    lo = (a * lo) / (1.0f + b * lo);
  }
  sigma_max_ = hi;
  sigma_min_ = lo;
}

void FlowUniPCMultistepScheduler::set_timesteps(int n) {
  check_num_inference_steps(n);
  if (dynamic_shifting_ && !mu_)
    throw InvalidArgument(std::string(class_name()) + ": " + source_ +
                          " sets use_dynamic_shifting, so set_timesteps needs mu: call "
                          "set_shift_mu(mu) first");
  std::vector<double> sigmas = np::linspace(sigma_max_, sigma_min_, n + 1);
  sigmas.pop_back();
  const double shift = shift_override_.value_or(shift_);
  for (double& s : sigmas)
    s = dynamic_shifting_ ? time_shift(TimeShiftType::kExponential, *mu_, s)
                          : shift * s / (1 + (shift - 1) * s);
  install(sigmas, 0.0, n);
}

}  // namespace diffuse::schedulers
