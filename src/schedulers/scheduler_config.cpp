#include "schedulers/scheduler_config.h"

#include <torch/torch.h>

#include <cmath>
#include <sstream>

namespace diffuse::schedulers {
namespace {

std::string join(std::initializer_list<const char*> items) {
  std::ostringstream os;
  bool first = true;
  for (const char* s : items) {
    os << (first ? "" : ", ") << s;
    first = false;
  }
  return os.str();
}

// diffusers' betas_for_alpha_bar with the cosine transform ("squaredcos_cap_v2"), evaluated in
// double like the Python code and stored as float32.
torch::Tensor cosine_betas(int64_t n) {
  auto alpha_bar = [](double t) {
    double c = std::cos((t + 0.008) / 1.008 * M_PI / 2);
    return c * c;
  };
  std::vector<float> betas(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    double t1 = static_cast<double>(i) / static_cast<double>(n);
    double t2 = static_cast<double>(i + 1) / static_cast<double>(n);
    betas[static_cast<size_t>(i)] =
        static_cast<float>(std::min(1 - alpha_bar(t2) / alpha_bar(t1), 0.999));
  }
  return torch::tensor(betas, torch::kFloat32);
}

// Rescales betas to zero terminal SNR (arXiv:2305.08891, Algorithm 1), same float32 ops as
// diffusers.
torch::Tensor rescale_zero_terminal_snr(const torch::Tensor& betas) {
  auto alphas = 1.0 - betas;
  auto alphas_bar_sqrt = torch::cumprod(alphas, 0).sqrt();
  auto first = alphas_bar_sqrt[0].clone();
  auto last = alphas_bar_sqrt[-1].clone();
  alphas_bar_sqrt = alphas_bar_sqrt - last;
  alphas_bar_sqrt = alphas_bar_sqrt * (first / (first - last));
  auto alphas_bar = alphas_bar_sqrt.pow(2);
  auto ratios = alphas_bar.slice(0, 1) / alphas_bar.slice(0, 0, -1);
  return 1.0 - torch::cat({alphas_bar.slice(0, 0, 1), ratios});
}

}  // namespace

SchedulerConfig::SchedulerConfig(const io::JsonConfig& config) : json_(config) {
  const auto& j = config.json();
  if (j.contains("_use_default_values") && j["_use_default_values"].is_array()) {
    nlohmann::json filtered = j;
    for (const auto& key : j["_use_default_values"])
      if (key.is_string()) filtered.erase(key.get<std::string>());
    json_ = io::JsonConfig(std::move(filtered), config.source());
  }
}

int64_t SchedulerConfig::integer(const std::string& key, int64_t fallback) const {
  if (!json_.has(key)) return fallback;
  const auto& v = json_.json().at(key);
  if (v.is_number_integer()) return v.get<int64_t>();
  if (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>())
    return static_cast<int64_t>(v.get<double>());
  fail(key, "expected an integer, got " + v.dump());
}

double SchedulerConfig::shift(const std::string& key, double fallback) const {
  constexpr double kMaxShift = 1000.0;
  const double v = number(key, fallback);
  if (!(v > 0.0 && v <= kMaxShift))
    fail(key,
         "must be a number in (0, " + io::number_text(kMaxShift) + "], got " + io::number_text(v));
  return v;
}

std::optional<double> SchedulerConfig::optional_number(const std::string& key) const {
  if (!json_.has(key)) return std::nullopt;
  return number(key, 0.0);
}

std::string SchedulerConfig::choice(const std::string& key, const std::string& fallback,
                                    std::initializer_list<const char*> allowed) const {
  std::string value = json_.get<std::string>(key, fallback);
  for (const char* a : allowed)
    if (value == a) return value;
  fail(key, "unsupported value '" + value + "' (expected one of: " + join(allowed) + ")");
}

PredictionType SchedulerConfig::prediction_type(std::initializer_list<const char*> allowed) const {
  std::string p = choice("prediction_type", "epsilon", allowed);
  if (p == "epsilon") return PredictionType::kEpsilon;
  if (p == "v_prediction") return PredictionType::kVPrediction;
  return PredictionType::kSample;
}

TimestepSpacing SchedulerConfig::timestep_spacing(const std::string& fallback) const {
  std::string s = choice("timestep_spacing", fallback, {"linspace", "leading", "trailing"});
  if (s == "linspace") return TimestepSpacing::kLinspace;
  if (s == "leading") return TimestepSpacing::kLeading;
  return TimestepSpacing::kTrailing;
}

int64_t SchedulerConfig::num_train_timesteps() const {
  // Every table the schedulers build has one entry per training timestep.
  constexpr int64_t kMaxTrainTimesteps = 100000;
  int64_t n = integer("num_train_timesteps", 1000);
  if (n < 1 || n > kMaxTrainTimesteps)
    fail("num_train_timesteps",
         "must be in [1, " + std::to_string(kMaxTrainTimesteps) + "], got " + std::to_string(n));
  return n;
}

int64_t SchedulerConfig::steps_offset() const {
  const int64_t n = num_train_timesteps();
  const int64_t v = integer("steps_offset", 0);
  if (v < 0 || v >= n)
    fail("steps_offset", "must be in [0, num_train_timesteps - 1 = " + std::to_string(n - 1) +
                             "], got " + std::to_string(v));
  return v;
}

torch::Tensor SchedulerConfig::betas(const std::string& default_schedule, double default_start,
                                     double default_end, bool allow_rescale_zero_snr) const {
  const int64_t n = num_train_timesteps();
  torch::Tensor betas;
  if (json_.has("trained_betas")) {
    const auto& v = json_.json().at("trained_betas");
    if (!v.is_array()) fail("trained_betas", "expected an array of numbers, got " + v.dump());
    std::vector<double> values;
    for (const auto& x : v) {
      if (!x.is_number()) fail("trained_betas", "expected an array of numbers");
      const double b = x.get<double>();
      if (!(b > 0 && b < 1))
        fail("trained_betas", "entry " + std::to_string(values.size()) + " is " +
                                  std::to_string(b) + ", expected a value in (0, 1)");
      values.push_back(b);
    }
    if (static_cast<int64_t>(values.size()) != n)
      fail("trained_betas", "has " + std::to_string(values.size()) +
                                " entries, expected num_train_timesteps = " + std::to_string(n));
    betas = torch::tensor(values, torch::kFloat64).to(torch::kFloat32);
  } else {
    std::string schedule =
        choice("beta_schedule", default_schedule, {"linear", "scaled_linear", "squaredcos_cap_v2"});
    double start = number("beta_start", default_start);
    double end = number("beta_end", default_end);
    if (!(start > 0 && start < 1))
      fail("beta_start", "must be in (0, 1), got " + std::to_string(start));
    if (!(end > 0 && end < 1)) fail("beta_end", "must be in (0, 1), got " + std::to_string(end));
    if (start > end)
      fail("beta_start", "is above beta_end (" + std::to_string(start) + " > " +
                             std::to_string(end) + "): the noise schedule would run backwards");
    if (schedule == "linear") {
      betas = torch::linspace(start, end, n, torch::kFloat32);
    } else if (schedule == "scaled_linear") {
      betas = torch::linspace(std::sqrt(start), std::sqrt(end), n, torch::kFloat32).pow(2);
    } else {
      betas = cosine_betas(n);
    }
  }
  if (allow_rescale_zero_snr && flag("rescale_betas_zero_snr", false))
    betas = rescale_zero_terminal_snr(betas);
  return betas;
}

torch::Tensor alphas_cumprod_from_betas(const torch::Tensor& betas) {
  return torch::cumprod(1.0 - betas, 0);
}

}  // namespace diffuse::schedulers
