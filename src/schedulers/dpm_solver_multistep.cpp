#include "schedulers/dpm_solver_multistep.h"

#include <torch/torch.h>

#include <cmath>

#include "diffuse/errors.h"
#include "schedulers/numpy_ops.h"
#include "schedulers/sigma_scheduler.h"
#include "schedulers/step_utils.h"

namespace diffuse::schedulers {
namespace {

using Algorithm = DPMSolverMultistepScheduler::Algorithm;

Algorithm parse_algorithm(const SchedulerConfig& config) {
  // "deis" is accepted and mapped to dpmsolver++, as diffusers does.
  std::string a =
      config.choice("algorithm_type", "dpmsolver++",
                    {"dpmsolver++", "dpmsolver", "sde-dpmsolver++", "sde-dpmsolver", "deis"});
  if (a == "dpmsolver") return Algorithm::kDpmSolver;
  if (a == "sde-dpmsolver") return Algorithm::kSdeDpmSolver;
  if (a == "sde-dpmsolver++") return Algorithm::kSdeDpmSolverPP;
  return Algorithm::kDpmSolverPP;
}

std::vector<float> to_floats(const torch::Tensor& t) {
  auto c = t.contiguous();
  return std::vector<float>(c.data_ptr<float>(), c.data_ptr<float>() + c.numel());
}

}  // namespace

DPMSolverMultistepScheduler::DPMSolverMultistepScheduler(const SchedulerConfig& config)
    : Scheduler(config.source(), sigma_alphas_cumprod(config)),
      solver_order_(static_cast<int>(config.integer("solver_order", 2))),
      prediction_type_(config.prediction_type()),
      thresholding_(config.flag("thresholding", false)),
      dynamic_thresholding_ratio_(config.number("dynamic_thresholding_ratio", 0.995)),
      sample_max_value_(config.number("sample_max_value", 1.0)),
      algorithm_(parse_algorithm(config)),
      // logrho/bh1/bh2 (UniPC/DEIS solver types) map to midpoint, as diffusers does.
      heun_(config.choice("solver_type", "midpoint",
                          {"midpoint", "heun", "logrho", "bh1", "bh2"}) == "heun"),
      lower_order_final_(config.flag("lower_order_final", true)),
      euler_at_final_(config.flag("euler_at_final", false)),
      karras_(config.flag("use_karras_sigmas", false)),
      lu_lambdas_(config.flag("use_lu_lambdas", false)),
      sigma_min_(config.optional_number("sigma_min")),
      sigma_max_(config.optional_number("sigma_max")),
      final_sigma_min_(config.choice("final_sigmas_type", "zero", {"zero", "sigma_min"}) ==
                       "sigma_min"),
      lambda_min_clipped_(config.number("lambda_min_clipped", -INFINITY)),
      learned_variance_(false),
      spacing_(config.timestep_spacing("linspace")),
      steps_offset_(config.steps_offset()) {
  if (solver_order_ < 1 || solver_order_ > 3)
    config.fail("solver_order", "must be 1, 2 or 3, got " + std::to_string(solver_order_));
  if (!is_data_prediction() && !final_sigma_min_)
    config.fail(
        "final_sigmas_type",
        "'zero' is not supported with algorithm_type dpmsolver / sde-dpmsolver; use 'sigma_min'");
  if (is_sde() && solver_order_ == 3)
    config.fail("solver_order", "3 is not supported with the SDE algorithm types");
  std::string variance = config.json().get<std::string>("variance_type", "");
  learned_variance_ = variance == "learned" || variance == "learned_range";
  lambda_t_ =
      torch::log(torch::sqrt(alphas_cumprod_)) - torch::log(torch::sqrt(1 - alphas_cumprod_));
}

void DPMSolverMultistepScheduler::set_timesteps(int n) {
  check_num_inference_steps(n);
  const int64_t T = num_train_timesteps_;
  // Timesteps whose lambda is below lambda_min_clipped are cut off the end of the schedule.
  const int64_t clipped =
      torch::searchsorted(lambda_t_.flip(0), torch::Scalar(lambda_min_clipped_)).item<int64_t>();
  const int64_t last = T - clipped;

  std::vector<double> t;
  if (spacing_ == TimestepSpacing::kLinspace) {
    t = np::reversed(np::round(np::linspace(0, static_cast<double>(last - 1), n + 1)));
    t.pop_back();
  } else if (spacing_ == TimestepSpacing::kLeading) {
    const int64_t ratio = last / (n + 1);
    for (int64_t i = n; i >= 1; --i) t.push_back(static_cast<double>(i * ratio + steps_offset_));
  } else {
    t = np::round(np::arange(static_cast<double>(last), 0, -(static_cast<double>(T) / n)));
    for (auto& x : t) x -= 1;
  }
  if (t.empty())
    throw InvalidArgument("DPMSolverMultistepScheduler: lambda_min_clipped leaves no timesteps");

  const std::vector<float> train = to_floats(training_sigmas(alphas_cumprod_));
  std::vector<double> log_sigmas;
  for (float s : train) log_sigmas.push_back(std::log(s));
  std::vector<double> sigmas;
  if (karras_) {
    const double lo = sigma_min_ ? *sigma_min_ : static_cast<double>(train.front());
    const double hi = sigma_max_ ? *sigma_max_ : static_cast<double>(train.back());
    sigmas = np::karras_sigmas(lo, hi, n);
    t.clear();
    for (double s : sigmas) t.push_back(np::round(np::sigma_to_t(s, log_sigmas)));
  } else if (lu_lambdas_) {
    // Uniform in lambda (rho = 1): from log_sigmas[-1] down to log_sigmas[0].
    const double lambda_min = log_sigmas.front(), lambda_max = log_sigmas.back();
    t.clear();
    for (double r : np::linspace(0, 1, n)) {
      double s = std::exp(lambda_max + r * (lambda_min - lambda_max));
      sigmas.push_back(s);
      t.push_back(np::round(np::sigma_to_t(s, log_sigmas)));
    }
  } else {
    sigmas = np::interp_on_index_grid(t, std::vector<double>(train.begin(), train.end()));
  }
  double final_sigma = 0.0;
  if (final_sigma_min_) {
    const float a0 = alpha_cumprod_at(0);
    final_sigma = std::sqrt((1.0f - a0) / a0);
  }
  std::vector<float> sig(sigmas.begin(), sigmas.end());
  sig.push_back(static_cast<float>(final_sigma));
  std::vector<int64_t> ints(t.begin(), t.end());

  timesteps_ = torch::tensor(ints, torch::kInt64);
  sigmas_ = torch::tensor(sig, torch::kFloat32);
  num_inference_steps_ = static_cast<int>(ints.size());
  model_outputs_.assign(static_cast<size_t>(solver_order_), torch::Tensor());
  lower_order_nums_ = 0;
  reset_step_index();
}

DPMSolverMultistepScheduler::Point DPMSolverMultistepScheduler::point(int64_t index) const {
  const float s = sigma_at(index);
  Point p;
  p.alpha = 1.0f / std::sqrt(s * s + 1.0f);
  p.sigma = s * p.alpha;
  p.lambda = std::log(p.alpha) - std::log(p.sigma);
  return p;
}

torch::Tensor DPMSolverMultistepScheduler::convert_model_output(torch::Tensor model_output,
                                                                const torch::Tensor& sample) const {
  const Point p = point(*step_index_);
  const double alpha = p.alpha, sigma = p.sigma;
  if (learned_variance_ && prediction_type_ == PredictionType::kEpsilon)
    model_output = model_output.slice(1, 0, 3);
  if (is_data_prediction()) {
    torch::Tensor x0;
    switch (prediction_type_) {
      case PredictionType::kEpsilon:
        x0 = (sample - model_output * sigma) / alpha;
        break;
      case PredictionType::kSample:
        x0 = model_output;
        break;
      case PredictionType::kVPrediction:
        x0 = sample * alpha - model_output * sigma;
        break;
    }
    if (thresholding_) x0 = threshold_sample(x0, dynamic_thresholding_ratio_, sample_max_value_);
    return x0;
  }
  torch::Tensor eps;
  switch (prediction_type_) {
    case PredictionType::kEpsilon:
      eps = model_output;
      break;
    case PredictionType::kSample:
      eps = (sample - model_output * alpha) / sigma;
      break;
    case PredictionType::kVPrediction:
      eps = model_output * alpha + sample * sigma;
      break;
  }
  if (thresholding_) {
    auto x0 = threshold_sample((sample - eps * sigma) / alpha, dynamic_thresholding_ratio_,
                               sample_max_value_);
    eps = (sample - x0 * alpha) / sigma;
  }
  return eps;
}

torch::Tensor DPMSolverMultistepScheduler::first_order_update(const torch::Tensor& x,
                                                              const torch::Tensor& sample,
                                                              const torch::Tensor& noise) const {
  const int64_t i = *step_index_;
  const Point t = point(i + 1), s = point(i);
  const float h = t.lambda - s.lambda;
  auto d = [](float v) { return static_cast<double>(v); };
  switch (algorithm_) {
    case Algorithm::kDpmSolverPP:
      return sample * d(t.sigma / s.sigma) - x * d(t.alpha * (std::exp(-h) - 1.0f));
    case Algorithm::kDpmSolver:
      return sample * d(t.alpha / s.alpha) - x * d(t.sigma * (std::exp(h) - 1.0f));
    case Algorithm::kSdeDpmSolverPP:
      return sample * d(t.sigma / s.sigma * std::exp(-h)) +
             x * d(t.alpha * (1 - std::exp(-2.0f * h))) +
             noise * d(t.sigma * std::sqrt(1.0f - std::exp(-2 * h)));
    case Algorithm::kSdeDpmSolver:
      return sample * d(t.alpha / s.alpha) - x * d(2.0f * (t.sigma * (std::exp(h) - 1.0f))) +
             noise * d(t.sigma * std::sqrt(std::exp(2 * h) - 1.0f));
  }
  return torch::Tensor();
}

torch::Tensor DPMSolverMultistepScheduler::second_order_update(const torch::Tensor& sample,
                                                               const torch::Tensor& noise) const {
  const int64_t i = *step_index_;
  const Point t = point(i + 1), s0 = point(i), s1 = point(i - 1);
  const auto& m0 = model_outputs_[model_outputs_.size() - 1];
  const auto& m1 = model_outputs_[model_outputs_.size() - 2];
  const float h = t.lambda - s0.lambda;
  const float h0 = s0.lambda - s1.lambda;
  const float r0 = h0 / h;
  const auto& D0 = m0;
  auto D1 = (m0 - m1) * static_cast<double>(1.0f / r0);
  auto d = [](float v) { return static_cast<double>(v); };
  switch (algorithm_) {
    case Algorithm::kDpmSolverPP:
      if (!heun_)
        return sample * d(t.sigma / s0.sigma) - D0 * d(t.alpha * (std::exp(-h) - 1.0f)) -
               D1 * d(0.5f * (t.alpha * (std::exp(-h) - 1.0f)));
      return sample * d(t.sigma / s0.sigma) - D0 * d(t.alpha * (std::exp(-h) - 1.0f)) +
             D1 * d(t.alpha * ((std::exp(-h) - 1.0f) / h + 1.0f));
    case Algorithm::kDpmSolver:
      if (!heun_)
        return sample * d(t.alpha / s0.alpha) - D0 * d(t.sigma * (std::exp(h) - 1.0f)) -
               D1 * d(0.5f * (t.sigma * (std::exp(h) - 1.0f)));
      return sample * d(t.alpha / s0.alpha) - D0 * d(t.sigma * (std::exp(h) - 1.0f)) -
             D1 * d(t.sigma * ((std::exp(h) - 1.0f) / h - 1.0f));
    case Algorithm::kSdeDpmSolverPP: {
      auto base = sample * d(t.sigma / s0.sigma * std::exp(-h)) +
                  D0 * d(t.alpha * (1 - std::exp(-2.0f * h)));
      base = heun_ ? base + D1 * d(t.alpha * ((1.0f - std::exp(-2.0f * h)) / (-2.0f * h) + 1.0f))
                   : base + D1 * d(0.5f * (t.alpha * (1 - std::exp(-2.0f * h))));
      return base + noise * d(t.sigma * std::sqrt(1.0f - std::exp(-2 * h)));
    }
    case Algorithm::kSdeDpmSolver: {
      auto base = sample * d(t.alpha / s0.alpha) - D0 * d(2.0f * (t.sigma * (std::exp(h) - 1.0f)));
      base = heun_ ? base - D1 * d(2.0f * (t.sigma * ((std::exp(h) - 1.0f) / h - 1.0f)))
                   : base - D1 * d(t.sigma * (std::exp(h) - 1.0f));
      return base + noise * d(t.sigma * std::sqrt(std::exp(2 * h) - 1.0f));
    }
  }
  return torch::Tensor();
}

torch::Tensor DPMSolverMultistepScheduler::third_order_update(const torch::Tensor& sample) const {
  const int64_t i = *step_index_;
  const Point t = point(i + 1), s0 = point(i), s1 = point(i - 1), s2 = point(i - 2);
  const size_t n = model_outputs_.size();
  const auto& m0 = model_outputs_[n - 1];
  const auto& m1 = model_outputs_[n - 2];
  const auto& m2 = model_outputs_[n - 3];
  const float h = t.lambda - s0.lambda, h0 = s0.lambda - s1.lambda, h1 = s1.lambda - s2.lambda;
  const float r0 = h0 / h, r1 = h1 / h;
  auto d = [](float v) { return static_cast<double>(v); };
  const auto& D0 = m0;
  auto D1_0 = (m0 - m1) * d(1.0f / r0);
  auto D1_1 = (m1 - m2) * d(1.0f / r1);
  auto D1 = D1_0 + (D1_0 - D1_1) * d(r0 / (r0 + r1));
  auto D2 = (D1_0 - D1_1) * d(1.0f / (r0 + r1));
  if (algorithm_ == Algorithm::kDpmSolverPP)
    return sample * d(t.sigma / s0.sigma) - D0 * d(t.alpha * (std::exp(-h) - 1.0f)) +
           D1 * d(t.alpha * ((std::exp(-h) - 1.0f) / h + 1.0f)) -
           D2 * d(t.alpha * ((std::exp(-h) - 1.0f + h) / (h * h) - 0.5f));
  return sample * d(t.alpha / s0.alpha) - D0 * d(t.sigma * (std::exp(h) - 1.0f)) -
         D1 * d(t.sigma * ((std::exp(h) - 1.0f) / h - 1.0f)) -
         D2 * d(t.sigma * ((std::exp(h) - 1.0f - h) / (h * h) - 0.5f));
}

StepOutput DPMSolverMultistepScheduler::step(const torch::Tensor& model_output,
                                             const torch::Tensor& timestep,
                                             const torch::Tensor& sample_in,
                                             const StepNoise& noise) {
  require_timesteps("step");
  init_step_index(timestep, /*missing_is_last=*/true);
  const int64_t i = *step_index_;
  const auto len = timesteps_.size(0);
  const bool final_step = i == len - 1;
  // Lower-order steps at the end stabilise few-step sampling (and a zero final sigma needs a
  // first-order step).
  const bool lower_order_final =
      final_step && (euler_at_final_ || (lower_order_final_ && len < 15) || !final_sigma_min_);
  const bool lower_order_second = i == len - 2 && lower_order_final_ && len < 15;

  auto x = convert_model_output(model_output, sample_in);
  for (size_t k = 0; k + 1 < model_outputs_.size(); ++k) model_outputs_[k] = model_outputs_[k + 1];
  model_outputs_.back() = x;

  auto sample = sample_in.to(torch::kFloat32);
  torch::Tensor step_noise_tensor;
  if (is_sde()) step_noise_tensor = step_noise(noise, sample, class_name());

  torch::Tensor prev;
  if (solver_order_ == 1 || lower_order_nums_ < 1 || lower_order_final)
    prev = first_order_update(x, sample, step_noise_tensor);
  else if (solver_order_ == 2 || lower_order_nums_ < 2 || lower_order_second)
    prev = second_order_update(sample, step_noise_tensor);
  else
    prev = third_order_update(sample);
  if (lower_order_nums_ < solver_order_) ++lower_order_nums_;
  step_index_ = i + 1;
  return {prev.to(x.scalar_type()), torch::Tensor()};
}

torch::Tensor DPMSolverMultistepScheduler::add_noise(const torch::Tensor& original,
                                                     const torch::Tensor& noise,
                                                     const torch::Tensor& timesteps) {
  auto indices = noise_step_indices(timesteps, /*missing_is_last=*/true);
  auto sigma = per_sample(sigmas_.index_select(0, torch::tensor(indices, torch::kInt64)), original,
                          class_name());
  auto alpha_t = 1 / (sigma.pow(2) + 1).pow(0.5);
  auto sigma_t = sigma * alpha_t;
  return alpha_t * original + sigma_t * noise.to(original.device());
}

}  // namespace diffuse::schedulers
