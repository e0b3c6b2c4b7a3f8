#include "schedulers/flow_match.h"

#include <torch/torch.h>

#include <cmath>
#include <sstream>

#include "diffuse/errors.h"
#include "io/json_config.h"
#include "schedulers/numpy_ops.h"
#include "schedulers/step_utils.h"

namespace diffuse::schedulers {
namespace {

// diffusers' __init__ builds the training sigmas in float32 torch arithmetic and bounds every
// inference schedule by the first and last of them; this is entry `t` (t = N .. 1).
float training_sigma(const FlowScheduleOptions& o, int64_t t) {
  const float s = static_cast<float>(t) / static_cast<float>(o.num_train_timesteps);
  if (o.dynamic_shifting) return s;
  // torch casts the Python scalars to float32 before the tensor operations.
  const float shift = static_cast<float>(o.shift);
  const float shift_minus_one = static_cast<float>(o.shift - 1.0);
  return (shift * s) / (1.0f + shift_minus_one * s);
}

}  // namespace

double calculate_shift(int64_t image_seq_len, int64_t base_seq_len, int64_t max_seq_len,
                       double base_shift, double max_shift) {
  const double m = (max_shift - base_shift) / static_cast<double>(max_seq_len - base_seq_len);
  const double b = base_shift - m * static_cast<double>(base_seq_len);
  return static_cast<double>(image_seq_len) * m + b;
}

double time_shift(TimeShiftType type, double mu, double sigma) {
  // diffusers raises (1/t - 1) to the power 1.0, which is exact: left out.
  if (type == TimeShiftType::kLinear) return mu / (mu + (1.0 / sigma - 1.0));
  const double e = std::exp(mu);
  return e / (e + (1.0 / sigma - 1.0));
}

namespace {

// The conversions after the shift (shift_terminal, Karras / exponential sigmas), float32
// timesteps and the terminal 0.
FlowSchedule finish_schedule(const FlowScheduleOptions& o, std::vector<double> sigmas) {
  const int n = static_cast<int>(sigmas.size());
  // diffusers tests shift_terminal for truthiness: 0 means off.
  if (o.shift_terminal && *o.shift_terminal != 0.0) {
    const double scale = (1.0 - sigmas.back()) / (1.0 - *o.shift_terminal);
    // A schedule ending at sigma 1 (one step from pure noise) cannot be stretched: diffusers
    // divides by zero and denoises with NaN.
    if (!(scale > 0))
      throw InvalidArgument("shift_terminal " + std::to_string(*o.shift_terminal) +
                            " stretches the schedule to end there, but its last sigma is " +
                            std::to_string(sigmas.back()) +
                            " (a single step from pure noise): use at least 2 steps");
    for (double& s : sigmas) s = 1.0 - (1.0 - s) / scale;
  }
  if (o.conversion == FlowSigmaConversion::kKarras) {
    sigmas = np::karras_sigmas(sigmas.back(), sigmas.front(), n);
  } else if (o.conversion == FlowSigmaConversion::kExponential) {
    const std::vector<double> logs =
        np::linspace(std::log(sigmas.front()), std::log(sigmas.back()), n);
    for (size_t i = 0; i < logs.size(); ++i) sigmas[i] = std::exp(logs[i]);
  }
  FlowSchedule out;
  for (double s : sigmas) {
    const auto s32 = static_cast<float>(s);
    out.sigmas.push_back(s32);
    out.timesteps.push_back(s32 * static_cast<float>(o.num_train_timesteps));
  }
  out.sigmas.push_back(0.0f);
  return out;
}

void require_mu(const FlowScheduleOptions& o, std::optional<double> mu) {
  if (o.dynamic_shifting && !mu)
    throw InvalidArgument(
        "flow-matching scheduler with use_dynamic_shifting: mu is required (call "
        "set_shift_mu(mu) before set_timesteps)");
}

}  // namespace

FlowSchedule make_flow_schedule(const FlowScheduleOptions& o, int n, std::optional<double> mu) {
  require_mu(o, mu);
  const auto N = static_cast<double>(o.num_train_timesteps);
  const double sigma_max = training_sigma(o, o.num_train_timesteps);
  const double sigma_min = training_sigma(o, 1);

  // diffusers' set_shift changes only this step, not the bounds computed at construction.
  const double shift = o.shift_override.value_or(o.shift);
  std::vector<double> sigmas = np::linspace(sigma_max * N, sigma_min * N, n);
  for (double& s : sigmas) {
    s /= N;
    s = o.dynamic_shifting ? time_shift(o.time_shift, *mu, s)
                           : shift * s / (1.0 + (shift - 1.0) * s);
  }
  return finish_schedule(o, sigmas);
}

FlowSchedule make_flow_schedule_from_sigmas(const FlowScheduleOptions& o,
                                            const std::vector<double>& given,
                                            std::optional<double> mu) {
  require_mu(o, mu);
  if (given.empty()) throw InvalidArgument("flow-matching scheduler: no sigmas given");
  const double shift = o.shift_override.value_or(o.shift);
  // numpy keeps a float32 array float32 under Python-float operands: every operation rounds.
  const auto e = static_cast<float>(mu ? std::exp(*mu) : 0.0);
  std::vector<double> sigmas;
  for (double g : given) {
    if (!(g > 0.0 && g <= 1.0))
      throw InvalidArgument("flow-matching scheduler: sigmas must be in (0, 1], got " +
                            io::number_text(g));
    const auto t = static_cast<float>(g);
    float s;
    if (!o.dynamic_shifting)
      s = (static_cast<float>(shift) * t) / (1.0f + static_cast<float>(shift - 1.0) * t);
    else if (o.time_shift == TimeShiftType::kLinear)
      s = static_cast<float>(*mu) / (static_cast<float>(*mu) + (1.0f / t - 1.0f));
    else
      s = e / (e + (1.0f / t - 1.0f));
    sigmas.push_back(s);
  }
  return finish_schedule(o, sigmas);
}

std::vector<double> flux_default_sigmas(int n) {
  if (n < 1) throw InvalidArgument("steps must be >= 1, got " + std::to_string(n));
  return np::linspace(1.0, 1.0 / n, n);
}

FlowMatchScheduler::FlowMatchScheduler(const SchedulerConfig& config, bool terminal_and_type)
    : Scheduler(config.source(), config.num_train_timesteps()) {
  options_.num_train_timesteps = num_train_timesteps_;
  options_.shift = config.shift("shift", 1.0);
  options_.dynamic_shifting = config.flag("use_dynamic_shifting", false);
  if (terminal_and_type) {
    options_.time_shift =
        config.choice("time_shift_type", "exponential", {"exponential", "linear"}) == "linear"
            ? TimeShiftType::kLinear
            : TimeShiftType::kExponential;
    options_.shift_terminal = config.optional_number("shift_terminal");
    if (options_.shift_terminal &&
        !(*options_.shift_terminal >= 0.0 && *options_.shift_terminal < 1.0))
      config.fail("shift_terminal",
                  "must be in [0, 1), got " + io::number_text(*options_.shift_terminal));
  }
  const bool karras = config.flag("use_karras_sigmas", false);
  const bool exponential = config.flag("use_exponential_sigmas", false);
  const bool beta = config.flag("use_beta_sigmas", false);
  if (static_cast<int>(karras) + static_cast<int>(exponential) + static_cast<int>(beta) > 1)
    config.fail("use_karras_sigmas",
                "only one of use_karras_sigmas, use_exponential_sigmas, use_beta_sigmas may be "
                "true");
  if (beta) config.fail("use_beta_sigmas", "true is not supported");
  options_.conversion = karras        ? FlowSigmaConversion::kKarras
                        : exponential ? FlowSigmaConversion::kExponential
                                      : FlowSigmaConversion::kNone;
  // Only Mochi inverts the schedule; no supported model needs it.
  if (config.flag("invert_sigmas", false)) config.fail("invert_sigmas", "true is not supported");

  base_shift_ = config.number("base_shift", 0.5);
  max_shift_ = config.number("max_shift", 1.15);
  base_seq_len_ = config.integer("base_image_seq_len", 256);
  max_seq_len_ = config.integer("max_image_seq_len", 4096);
  if (max_seq_len_ == base_seq_len_)
    config.fail("max_image_seq_len",
                "must differ from base_image_seq_len (" + std::to_string(base_seq_len_) + ")");
}

void FlowMatchScheduler::set_timesteps(int n) {
  check_num_inference_steps(n);
  if (options_.dynamic_shifting && !mu_)
    throw InvalidArgument(std::string(class_name()) + ": " + source_ +
                          " sets use_dynamic_shifting, so set_timesteps needs mu: call "
                          "set_shift_mu(mu) first");
  const FlowSchedule schedule = make_flow_schedule(options_, n, mu_);
  timesteps_ = torch::tensor(schedule.timesteps, torch::kFloat32);
  sigmas_ = torch::tensor(schedule.sigmas, torch::kFloat32);
  num_inference_steps_ = n;
  reset_step_index();
}

void FlowMatchScheduler::set_timesteps_from_sigmas(const std::vector<double>& sigmas) {
  if (sigmas.empty() || sigmas.size() > static_cast<size_t>(num_train_timesteps_))
    throw InvalidArgument(std::string(class_name()) + ": expected 1 to " +
                          std::to_string(num_train_timesteps_) + " sigmas, got " +
                          std::to_string(sigmas.size()));
  if (options_.dynamic_shifting && !mu_)
    throw InvalidArgument(std::string(class_name()) + ": " + source_ +
                          " sets use_dynamic_shifting, so set_timesteps needs mu: call "
                          "set_shift_mu(mu) first");
  const FlowSchedule schedule = make_flow_schedule_from_sigmas(options_, sigmas, mu_);
  timesteps_ = torch::tensor(schedule.timesteps, torch::kFloat32);
  sigmas_ = torch::tensor(schedule.sigmas, torch::kFloat32);
  num_inference_steps_ = static_cast<int>(sigmas.size());
  reset_step_index();
}

void FlowMatchScheduler::set_shift(std::optional<double> shift) {
  if (shift && !(*shift > 0.0 && std::isfinite(*shift)))
    throw InvalidArgument(std::string(class_name()) + ": shift must be a finite number > 0, got " +
                          io::number_text(*shift));
  options_.shift_override = shift;
}

double FlowMatchScheduler::shift_mu_for(int64_t image_seq_len) const {
  return calculate_shift(image_seq_len, base_seq_len_, max_seq_len_, base_shift_, max_shift_);
}

torch::Tensor FlowMatchScheduler::add_noise(const torch::Tensor& original,
                                            const torch::Tensor& noise,
                                            const torch::Tensor& timesteps) {
  auto indices = noise_step_indices(timesteps);
  auto sigma =
      sigmas_.to(original.scalar_type()).index_select(0, torch::tensor(indices, torch::kInt64));
  sigma = per_sample(sigma, original, class_name());
  return sigma * noise.to(original.device()) + (1.0 - sigma) * original;
}

FlowMatchScheduler::StepSigmas FlowMatchScheduler::begin_step(const torch::Tensor& timestep) {
  require_timesteps("step");
  init_step_index(timestep);
  const int64_t i = *step_index_;
  return {i, sigma_at(i), sigma_at(i + 1)};
}

}  // namespace diffuse::schedulers
