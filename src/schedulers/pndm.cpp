#include "schedulers/pndm.h"

#include <torch/torch.h>

#include <cmath>

#include "diffuse/errors.h"
#include "schedulers/numpy_ops.h"
#include "schedulers/step_utils.h"

namespace diffuse::schedulers {
namespace {

constexpr int64_t kPndmOrder = 4;

// Python slice v[begin:end] with negative indices counted from the end.
std::vector<int64_t> slice(const std::vector<int64_t>& v, int64_t begin, int64_t end) {
  const auto n = static_cast<int64_t>(v.size());
  auto clamp = [n](int64_t i) { return std::min(std::max(i < 0 ? i + n : i, int64_t{0}), n); };
  int64_t b = clamp(begin), e = clamp(end);
  if (e <= b) return {};
  return std::vector<int64_t>(v.begin() + b, v.begin() + e);
}

}  // namespace

PNDMScheduler::PNDMScheduler(const SchedulerConfig& config)
    : Scheduler(config.source(),
                alphas_cumprod_from_betas(config.betas("linear", 0.0001, 0.02, false))),
      prediction_type_(config.prediction_type({"epsilon", "v_prediction"})),
      spacing_(config.timestep_spacing("leading")),
      steps_offset_(config.steps_offset()),
      skip_prk_steps_(config.flag("skip_prk_steps", false)),
      final_alpha_cumprod_(config.flag("set_alpha_to_one", false) ? 1.0f : alpha_cumprod_at(0)) {}

void PNDMScheduler::set_timesteps(int n) {
  check_num_inference_steps(n);
  const int64_t T = num_train_timesteps_;
  // The base schedule, ascending.
  std::vector<int64_t> base;
  if (spacing_ == TimestepSpacing::kLinspace) {
    for (double x : np::round(np::linspace(0, static_cast<double>(T - 1), n)))
      base.push_back(static_cast<int64_t>(x));
  } else if (spacing_ == TimestepSpacing::kLeading) {
    for (int64_t i = 0; i < n; ++i) base.push_back(i * (T / n) + steps_offset_);
  } else {
    auto t = np::round(np::arange(static_cast<double>(T), 0, -(static_cast<double>(T) / n)));
    for (auto it = t.rbegin(); it != t.rend(); ++it) base.push_back(static_cast<int64_t>(*it) - 1);
  }

  std::vector<int64_t> plms;
  prk_timesteps_.clear();
  if (skip_prk_steps_) {
    // base[:-1] + base[-2:-1] + base[-1:], reversed: the second-to-last timestep is repeated
    // because the first PLMS step needs two model evaluations.
    plms = slice(base, 0, -1);
    for (int64_t x : slice(base, -2, -1)) plms.push_back(x);
    for (int64_t x : slice(base, -1, static_cast<int64_t>(base.size()))) plms.push_back(x);
    std::reverse(plms.begin(), plms.end());
  } else {
    if (static_cast<int64_t>(base.size()) < kPndmOrder)
      throw InvalidArgument(
          "PNDMScheduler: without skip_prk_steps num_inference_steps must be >= 4, got " +
          std::to_string(n));
    const int64_t half = T / n / 2;
    std::vector<int64_t> prk;
    for (int64_t x : slice(base, -kPndmOrder, static_cast<int64_t>(base.size()))) {
      prk.push_back(x);
      prk.push_back(x + half);
    }
    // prk[:-1].repeat(2)[1:-1], reversed.
    std::vector<int64_t> doubled;
    for (size_t i = 0; i + 1 < prk.size(); ++i) {
      doubled.push_back(prk[i]);
      doubled.push_back(prk[i]);
    }
    prk_timesteps_.assign(doubled.begin() + 1, doubled.end() - 1);
    std::reverse(prk_timesteps_.begin(), prk_timesteps_.end());
    plms = slice(base, 0, -3);
    std::reverse(plms.begin(), plms.end());
  }
  std::vector<int64_t> all = prk_timesteps_;
  all.insert(all.end(), plms.begin(), plms.end());
  timesteps_ = torch::tensor(all, torch::kInt64);
  num_inference_steps_ = n;
  ets_.clear();
  cur_model_output_ = torch::Tensor();
  cur_sample_ = torch::Tensor();
  counter_ = 0;
}

StepOutput PNDMScheduler::step(const torch::Tensor& model_output, const torch::Tensor& timestep,
                               const torch::Tensor& sample, const StepNoise& noise) {
  require_timesteps("step");
  const int64_t t = timestep.item<int64_t>();
  if (counter_ < static_cast<int64_t>(prk_timesteps_.size()) && !skip_prk_steps_)
    return {step_prk(model_output, t, sample), torch::Tensor()};
  return {step_plms(model_output, t, sample), torch::Tensor()};
}

torch::Tensor PNDMScheduler::step_prk(const torch::Tensor& model_output, int64_t timestep,
                                      const torch::Tensor& sample) {
  const int64_t diff_to_prev = counter_ % 2 ? 0 : num_train_timesteps_ / num_inference_steps_ / 2;
  const int64_t prev_t = timestep - diff_to_prev;
  const int64_t t = prk_timesteps_[static_cast<size_t>(counter_ / 4 * 4)];
  auto accumulate = [this](const torch::Tensor& x) {
    cur_model_output_ = cur_model_output_.defined() ? cur_model_output_ + x : x;
  };
  torch::Tensor mo = model_output;
  switch (counter_ % 4) {
    case 0:
      accumulate(model_output * (1.0 / 6));
      ets_.push_back(model_output);
      cur_sample_ = sample;
      break;
    case 1:
    case 2:
      accumulate(model_output * (1.0 / 3));
      break;
    default:
      mo = model_output * (1.0 / 6);
      if (cur_model_output_.defined()) mo = cur_model_output_ + mo;
      cur_model_output_ = torch::Tensor();
      break;
  }
  const torch::Tensor& from = cur_sample_.defined() ? cur_sample_ : sample;
  auto prev = prev_sample(from, t, prev_t, mo);
  ++counter_;
  return prev;
}

torch::Tensor PNDMScheduler::step_plms(const torch::Tensor& model_output, int64_t timestep,
                                       torch::Tensor sample) {
  if (!skip_prk_steps_ && ets_.size() < 3)
    throw InvalidArgument("PNDMScheduler: PLMS steps need the 12 Runge-Kutta steps first");
  int64_t t = timestep;
  int64_t prev_t = timestep - num_train_timesteps_ / num_inference_steps_;
  if (counter_ != 1) {
    if (ets_.size() > 3) ets_.erase(ets_.begin(), ets_.end() - 3);
    ets_.push_back(model_output);
  } else {
    // The repeated timestep: evaluate again at t and average (a second-order warm-up step).
    prev_t = timestep;
    t = timestep + num_train_timesteps_ / num_inference_steps_;
  }
  torch::Tensor mo;
  const size_t n = ets_.size();
  if (n == 1 && counter_ == 0) {
    mo = model_output;
    cur_sample_ = sample;
  } else if (n == 1 && counter_ == 1) {
    mo = (model_output + ets_[0]) / 2;
    sample = cur_sample_;
    cur_sample_ = torch::Tensor();
  } else if (n == 2) {
    mo = (ets_[1] * 3 - ets_[0]) / 2;
  } else if (n == 3) {
    mo = (ets_[2] * 23 - ets_[1] * 16 + ets_[0] * 5) / 12;
  } else {
    mo = (ets_[3] * 55 - ets_[2] * 59 + ets_[1] * 37 - ets_[0] * 9) * (1.0 / 24);
  }
  auto prev = prev_sample(sample, t, prev_t, mo);
  ++counter_;
  return prev;
}

torch::Tensor PNDMScheduler::prev_sample(const torch::Tensor& sample, int64_t t, int64_t prev_t,
                                         torch::Tensor model_output) const {
  // Formula (9) of the PNDM paper, with float32 scalars like diffusers' 0-d tensors.
  const float alpha_t = alpha_cumprod_at(t);
  const float alpha_prev = prev_t >= 0 ? alpha_cumprod_at(prev_t) : final_alpha_cumprod_;
  const float beta_t = 1.0f - alpha_t;
  const float beta_prev = 1.0f - alpha_prev;
  if (prediction_type_ == PredictionType::kVPrediction)
    model_output = model_output * static_cast<double>(std::sqrt(alpha_t)) +
                   sample * static_cast<double>(std::sqrt(beta_t));
  const float sample_coeff = std::sqrt(alpha_prev / alpha_t);
  const float denom = alpha_t * std::sqrt(beta_prev) + std::sqrt(alpha_t * beta_t * alpha_prev);
  return sample * static_cast<double>(sample_coeff) -
         model_output * static_cast<double>(alpha_prev - alpha_t) / static_cast<double>(denom);
}

torch::Tensor PNDMScheduler::add_noise(const torch::Tensor& original, const torch::Tensor& noise,
                                       const torch::Tensor& timesteps) {
  return add_noise_alphas_cumprod(alphas_cumprod_, original, noise, timesteps, class_name());
}

}  // namespace diffuse::schedulers
