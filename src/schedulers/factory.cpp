// make_scheduler: the table of scheduler names and classes.
#include <torch/torch.h>

#include <functional>

#include "diffuse/errors.h"
#include "io/json_config.h"
#include "schedulers/ddim.h"
#include "schedulers/dpm_solver_multistep.h"
#include "schedulers/euler_ancestral_discrete.h"
#include "schedulers/euler_discrete.h"
#include "schedulers/flow_match_euler_discrete.h"
#include "schedulers/flow_match_flash_euler.h"
#include "schedulers/flow_match_lcm.h"
#include "schedulers/flow_unipc_multistep.h"
#include "schedulers/lms_discrete.h"
#include "schedulers/pndm.h"
#include "schedulers/scheduler.h"

namespace diffuse::schedulers {
namespace {

struct Entry {
  const char* name;        // short name (CLI / API)
  const char* class_name;  // diffusers class
  std::function<std::unique_ptr<Scheduler>(const SchedulerConfig&)> make;
  nlohmann::json overrides;  // applied on top of the base config for the short name
};

template <typename T>
std::unique_ptr<Scheduler> build(const SchedulerConfig& c) {
  return std::make_unique<T>(c);
}

const std::vector<Entry>& entries() {
  static const std::vector<Entry> table = {
      {"ddim", "DDIMScheduler", build<DDIMScheduler>, nlohmann::json::object()},
      {"pndm", "PNDMScheduler", build<PNDMScheduler>, nlohmann::json::object()},
      {"euler", "EulerDiscreteScheduler", build<EulerDiscreteScheduler>, nlohmann::json::object()},
      {"euler_a", "EulerAncestralDiscreteScheduler", build<EulerAncestralDiscreteScheduler>,
       nlohmann::json::object()},
      {"dpmpp_2m",
       "DPMSolverMultistepScheduler",
       build<DPMSolverMultistepScheduler>,
       {{"algorithm_type", "dpmsolver++"}, {"solver_order", 2}}},
      {"lms", "LMSDiscreteScheduler", build<LMSDiscreteScheduler>, nlohmann::json::object()},
  };
  return table;
}

const std::vector<Entry>& flow_entries() {
  static const std::vector<Entry> table = {
      {"flow_euler", "FlowMatchEulerDiscreteScheduler", build<FlowMatchEulerDiscreteScheduler>,
       nlohmann::json::object()},
      {"flow_lcm", "FlowMatchLCMScheduler", build<FlowMatchLCMScheduler>, nlohmann::json::object()},
      {"flash_flow_euler", "FlashFlowMatchEulerDiscreteScheduler",
       build<FlashFlowMatchEulerDiscreteScheduler>, nlohmann::json::object()},
      // diffusers' UniPC in its flow mode (the only one implemented), e.g. from a flow-matching
      // Euler config.
      {"unipc_flow",
       "UniPCMultistepScheduler",
       build<UniPCMultistepScheduler>,
       {{"use_flow_sigmas", true}, {"prediction_type", "flow_prediction"}}},
      {"flow_unipc", "FlowUniPCMultistepScheduler", build<FlowUniPCMultistepScheduler>,
       nlohmann::json::object()},
  };
  return table;
}

const Entry* find(const std::string& name, bool* by_short_name) {
  for (const auto* table : {&entries(), &flow_entries()}) {
    for (const auto& e : *table) {
      if (name == e.name) {
        *by_short_name = true;
        return &e;
      }
      if (name == e.class_name) {
        *by_short_name = false;
        return &e;
      }
    }
  }
  return nullptr;
}

std::string known_names() {
  std::string s;
  for (const auto* table : {&entries(), &flow_entries()})
    for (const auto& e : *table)
      s += std::string(s.empty() ? "" : ", ") + e.name + " (" + e.class_name + ")";
  return s;
}

}  // namespace

std::unique_ptr<Scheduler> make_scheduler(const io::JsonConfig& config) {
  std::string cls = config.require<std::string>("_class_name");
  bool short_name = false;
  const Entry* e = find(cls, &short_name);
  if (!e)
    config.fail("_class_name",
                "unsupported scheduler class '" + cls + "' (supported: " + known_names() + ")");
  return e->make(SchedulerConfig(config));
}

std::unique_ptr<Scheduler> make_scheduler(const std::string& name,
                                          const io::JsonConfig& base_config) {
  bool short_name = false;
  const Entry* e = find(name, &short_name);
  if (!e)
    throw InvalidArgument("unknown scheduler '" + name + "' (supported: " + known_names() + ")");
  if (!short_name || e->overrides.empty()) return e->make(SchedulerConfig(base_config));
  nlohmann::json j = base_config.json();
  for (const auto& [key, value] : e->overrides.items()) {
    j[key] = value;
    // An overridden key is no longer a default value.
    if (j.contains("_use_default_values") && j["_use_default_values"].is_array()) {
      auto& defaults = j["_use_default_values"];
      for (auto it = defaults.begin(); it != defaults.end();)
        it = (it->is_string() && it->get<std::string>() == key) ? defaults.erase(it) : it + 1;
    }
  }
  return e->make(SchedulerConfig(io::JsonConfig(std::move(j), base_config.source())));
}

std::vector<std::string> scheduler_names() {
  std::vector<std::string> out;
  for (const auto& e : entries()) out.push_back(e.name);
  return out;
}

std::vector<std::string> flow_scheduler_names() {
  std::vector<std::string> out;
  for (const auto& e : flow_entries()) out.push_back(e.name);
  return out;
}

}  // namespace diffuse::schedulers
