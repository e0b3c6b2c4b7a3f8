// Golden runner for component "scheduler": builds the scheduler from params.class +
// params.config and checks alphas_cumprod, the schedules for every timesteps_N / sigmas_N in
// the case, init_noise_sigma, and a trajectory driven by the supplied model outputs (and step
// noise), exactly as the diffusers pipelines call a scheduler. params.set_timesteps_kwargs are
// the extra arguments of every set_timesteps call (mu, shift: flow-matching shifts).
#include <torch/torch.h>

#include <cctype>
#include <limits>
#include <set>
#include <utility>

#include "diffuse/errors.h"
#include "io/json_config.h"
#include "io/model_folder.h"
#include "schedulers/flow_match.h"
#include "schedulers/scheduler.h"
#include "verify/runners.h"

namespace diffuse::verify {
namespace {

// N of "<prefix>N", or -1 if the name is not of that form.
int count_suffix(const std::string& name, const std::string& prefix) {
  if (name.compare(0, prefix.size(), prefix) != 0 || name.size() == prefix.size()) return -1;
  for (size_t i = prefix.size(); i < name.size(); ++i)
    if (!std::isdigit(static_cast<unsigned char>(name[i]))) return -1;
  return std::stoi(name.substr(prefix.size()));
}

Comparison failure(const std::string& reason) {
  Comparison c;
  c.passed = false;
  c.max_abs_err = std::numeric_limits<double>::infinity();
  c.reason = reason;
  return c;
}

Comparison compare_timesteps(const std::string& what, const torch::Tensor& got,
                             const torch::Tensor& expected) {
  // Integer schedules must match exactly and stay integer; float schedules to 1e-4.
  if (expected.scalar_type() == torch::kInt64) {
    if (got.scalar_type() != torch::kInt64)
      return failure(what + ": expected int64 timesteps, got " +
                     std::string(c10::toString(got.scalar_type())));
    return compare_exact(what, got, expected);
  }
  // Integer schedules stored as float (UniPC's in the HiDream set) hold whole numbers only.
  const bool whole = torch::equal(expected, expected.trunc());
  if (!torch::isFloatingType(got.scalar_type()) && !(got.scalar_type() == torch::kInt64 && whole))
    return failure(what + ": expected floating-point timesteps, got " +
                   std::string(c10::toString(got.scalar_type())));
  return compare(what, got.to(torch::kFloat64), expected, 1e-4, 0.0);
}

// Applies params.set_timesteps_kwargs; returns a reason if the case needs an argument the
// Scheduler interface has no counterpart for, so the case fails instead of running wrongly.
std::string apply_set_timesteps_kwargs(schedulers::Scheduler& scheduler, const GoldenCase& c) {
  const auto kwargs = c.param("set_timesteps_kwargs", nlohmann::json::object());
  for (const auto& [key, value] : kwargs.items()) {
    if (key == "mu" && value.is_number()) {
      scheduler.set_shift_mu(value.get<double>());
    } else if (key == "mu" && value.is_null()) {
      scheduler.set_shift_mu(std::nullopt);
    } else if (key == "shift" && value.is_number()) {
      scheduler.set_shift(value.get<double>());
    } else if (key == "shift" && value.is_null()) {
      scheduler.set_shift(std::nullopt);
    } else {
      return "set_timesteps argument " + key + "=" + value.dump() + " is not supported";
    }
  }
  return "";
}

}  // namespace

CaseResult verify_scheduler(const GoldenSet& set, const GoldenCase& c,
                            const VerifyOptions& options) {
  CaseResult result;
  CaseTensors tensors(c);
  if (!c.params.contains("config"))
    throw FormatError(c.where + ": params.config (the scheduler config) is missing");
  io::JsonConfig config(c.param("config", nlohmann::json()), c.name + " params.config");
  std::string cls = c.param("class", std::string());
  // A config without its class is the model folder's scheduler's (the SDXL set states it there).
  if (cls.empty() && !config.has("_class_name")) {
    const auto folder = io::ModelFolder::open(set.model_dir());
    cls = folder.component_config("scheduler", "scheduler_config.json")
              .get<std::string>("_class_name", "");
    if (cls.empty())
      throw FormatError(c.where + ": params.config names no _class_name, and neither does " +
                        set.model_dir() + "/scheduler/scheduler_config.json");
  }
  auto scheduler =
      cls.empty() ? schedulers::make_scheduler(config) : schedulers::make_scheduler(cls, config);
  const double atol = c.tol("atol", 1e-5);
  const double rtol = c.tol("rtol", 1e-5);
  const auto device = options.device;
  if (auto unsupported = apply_set_timesteps_kwargs(*scheduler, c); !unsupported.empty()) {
    result.add("set_timesteps_kwargs", failure(unsupported));
    return result;
  }

  if (tensors.has("alphas_cumprod"))
    result.add("alphas_cumprod", compare("alphas_cumprod", scheduler->alphas_cumprod(),
                                         tensors.get("alphas_cumprod"), atol, rtol));

  // FLUX-style cases call set_timesteps(sigmas=linspace(1, 1/N, N), mu=calculate_shift(S)):
  // their schedules are named timesteps_N.seqS (S: the image sequence length mu comes from).
  const std::string call = c.param("set_timesteps_call", std::string());
  const bool flux_sigmas = !call.empty();
  auto* flow = dynamic_cast<schedulers::FlowMatchScheduler*>(scheduler.get());
  if (flux_sigmas && (call.find("sigmas=np.linspace(1.0, 1/N, N)") == std::string::npos || !flow)) {
    result.add("set_timesteps_call", failure("set_timesteps call '" + call +
                                             "' is not supported for " + scheduler->class_name()));
    return result;
  }
  const auto set_schedule = [&](int n, int64_t image_seq_len) {
    if (!flux_sigmas) return scheduler->set_timesteps(n);
    flow->set_shift_mu(flow->shift_mu_for(image_seq_len));
    flow->set_timesteps_from_sigmas(schedulers::flux_default_sigmas(n));
  };

  std::set<std::pair<int, int64_t>> schedules;  // (steps, image sequence length or -1)
  for (const std::string prefix : {"timesteps_", "sigmas_"})
    for (const auto& name : tensors.names_with_prefix(prefix)) {
      const auto dot = name.find(".seq");
      const std::string head = name.substr(0, dot);
      const int n = count_suffix(head, prefix);
      if (n < 0) continue;
      const int64_t seq = dot == std::string::npos ? -1 : count_suffix(name.substr(dot), ".seq");
      if (dot == std::string::npos || seq >= 0) schedules.insert({n, seq});
    }
  const int64_t trajectory_seq = c.param("trajectory_image_seq_len", int64_t{-1});
  int trajectory_steps = c.param("num_inference_steps", 0);
  for (const auto& [n, seq] : schedules) {
    if (flux_sigmas && seq < 0 && trajectory_seq < 0)
      throw FormatError(c.where + ": timesteps_" + std::to_string(n) +
                        " has no .seq suffix and params.trajectory_image_seq_len is missing");
    set_schedule(n, seq >= 0 ? seq : trajectory_seq);
    const std::string suffix = std::to_string(n) + (seq >= 0 ? ".seq" + std::to_string(seq) : "");
    const std::string ts = "timesteps_" + suffix, sg = "sigmas_" + suffix;
    if (tensors.has(ts))
      result.add(ts, compare_timesteps(ts, scheduler->timesteps(), tensors.get(ts)));
    if (tensors.has(sg)) {
      if (!scheduler->sigmas().defined())
        result.add(sg, failure(sg + ": " + scheduler->class_name() + " has no sigmas"));
      else
        result.add(sg, compare(sg, scheduler->sigmas(), tensors.get(sg), atol, rtol));
    }
    if (flux_sigmas && seq < 0 && trajectory_steps == 0) trajectory_steps = n;
  }
  if (flux_sigmas)
    for (const auto& entry : c.params.value("mu_by_image_seq_len", nlohmann::json::array())) {
      if (!entry.is_object()) c.bad_param("mu_by_image_seq_len", "a list of objects");
      const auto seq = entry.value("image_seq_len", int64_t{0});
      result.add("mu.seq" + std::to_string(seq),
                 compare("mu.seq" + std::to_string(seq),
                         torch::tensor(flow->shift_mu_for(seq), torch::kFloat64),
                         torch::tensor(entry.value("mu", 0.0), torch::kFloat64), 1e-12, 1e-12));
    }

  if (trajectory_steps == 0) throw FormatError(c.where + ": params.num_inference_steps is missing");
  set_schedule(trajectory_steps, trajectory_seq);
  if (tensors.has("init_noise_sigma"))
    result.add(
        "init_noise_sigma",
        compare("init_noise_sigma", torch::tensor(scheduler->init_noise_sigma(), torch::kFloat64),
                tensors.get("init_noise_sigma").reshape({}), atol, rtol));

  if (!tensors.has("sample_0")) return result;
  auto sample = tensors.get("sample_0").to(device);
  const auto timesteps = scheduler->timesteps();
  for (int64_t i = 0; i < timesteps.size(0); ++i) {
    const std::string idx = "." + std::to_string(i);
    if (!tensors.has("model_output" + idx)) {
      result.add("model_output" + idx,
                 failure("schedule has " + std::to_string(timesteps.size(0)) +
                         " timesteps but the case has no model_output" + idx));
      return result;
    }
    const auto t = timesteps[i];
    auto scaled = scheduler->scale_model_input(sample, t);
    for (const std::string& name : {"scaled_model_input" + idx, "scaled_input" + idx})
      if (tensors.has(name)) result.add(name, compare(name, scaled, tensors.get(name), atol, rtol));
    schedulers::StepNoise noise;
    if (tensors.has("noise" + idx)) noise.noise = tensors.get("noise" + idx).to(device);
    auto out = scheduler->step(tensors.get("model_output" + idx).to(device), t, sample, noise);
    if (out.prev_sample.device() != sample.device())
      result.add("prev_sample" + idx,
                 failure("prev_sample" + idx + " is not on the sample's device"));
    if (tensors.has("prev_sample" + idx))
      result.add("prev_sample" + idx, compare("prev_sample" + idx, out.prev_sample,
                                              tensors.get("prev_sample" + idx), atol, rtol));
    if (tensors.has("pred_original_sample" + idx)) {
      const std::string what = "pred_original_sample" + idx;
      result.add(what, out.pred_original_sample.defined()
                           ? compare(what, out.pred_original_sample, tensors.get(what), atol, rtol)
                           : failure(what + ": the scheduler returned none"));
    }
    sample = out.prev_sample;
  }
  const std::string extra = "model_output." + std::to_string(timesteps.size(0));
  if (tensors.has(extra))
    result.add(extra, failure("the case has " + extra + " but the schedule has only " +
                              std::to_string(timesteps.size(0)) + " timesteps"));
  return result;
}

}  // namespace diffuse::verify
