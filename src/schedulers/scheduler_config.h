// Reading a scheduler_config.json the way diffusers' from_config does: each scheduler class
// reads only the keys it knows, with its own defaults; keys listed in "_use_default_values"
// (written by diffusers when a value was a default) are treated as absent so the new class
// gets its own default. Enumerated values are checked here so a bad value fails at
// construction with the file and key in the message.
#pragma once
#include <torch/types.h>
#include <cmath>

#include <initializer_list>
#include <optional>
#include <string>

#include "io/json_config.h"

namespace diffuse::schedulers {

enum class PredictionType { kEpsilon, kVPrediction, kSample };
enum class TimestepSpacing { kLinspace, kLeading, kTrailing };

class SchedulerConfig {
 public:
  explicit SchedulerConfig(const io::JsonConfig& config);

  const std::string& source() const { return json_.source(); }
  const io::JsonConfig& json() const { return json_; }

  bool flag(const std::string& key, bool fallback) const { return json_.get<bool>(key, fallback); }
  int64_t integer(const std::string& key, int64_t fallback) const;
  // Accepts "-inf"/"inf" strings for non-finite values.
  // NaN is refused ("nan" is never a meaningful setting); +-inf is allowed where a key means
  // "no bound" (lambda_min_clipped).
  double number(const std::string& key, double fallback) const {
    const double v = json_.get_number(key, fallback);
    if (std::isnan(v)) fail(key, "is NaN, expected a number");
    return v;
  }
  std::optional<double> optional_number(const std::string& key) const;
  // A flow-matching timestep shift (shift, flow_shift): finite, in (0, 1000]. Real models use
  // 1-12; far larger values overflow the float32 sigma arithmetic (shift * sigma) into NaN
  // timesteps, so they are refused here, naming the key, instead of failing mid-run.
  double shift(const std::string& key, double fallback) const;
  // A string that must be one of `allowed`; ConfigError naming the key and the choices.
  std::string choice(const std::string& key, const std::string& fallback,
                     std::initializer_list<const char*> allowed) const;

  PredictionType prediction_type(std::initializer_list<const char*> allowed = {
                                     "epsilon", "v_prediction", "sample"}) const;
  TimestepSpacing timestep_spacing(const std::string& fallback) const;

  // num_train_timesteps (default 1000), validated in [1, 100000].
  int64_t num_train_timesteps() const;
  // diffusers' steps_offset, in [0, num_train_timesteps): a larger one would step past the
  // schedule's tables.
  int64_t steps_offset() const;

  // float32 betas from trained_betas or beta_schedule/beta_start/beta_end with the class's
  // defaults, computed with the same torch operations as diffusers. If
  // `allow_rescale_zero_snr`, honours rescale_betas_zero_snr.
  torch::Tensor betas(const std::string& default_schedule, double default_start, double default_end,
                      bool allow_rescale_zero_snr) const;

  [[noreturn]] void fail(const std::string& key, const std::string& problem) const {
    json_.fail(key, problem);
  }

 private:
  io::JsonConfig json_;
};

// alphas_cumprod = cumprod(1 - betas) in float32, as diffusers.
torch::Tensor alphas_cumprod_from_betas(const torch::Tensor& betas);

}  // namespace diffuse::schedulers
