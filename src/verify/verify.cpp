#include "verify/verify.h"

#include <torch/torch.h>

#include <algorithm>

#include "diffuse/errors.h"
#include "verify/runners.h"

namespace diffuse::verify {
namespace {

using Runner = CaseResult (*)(const GoldenSet&, const GoldenCase&, const VerifyOptions&);

struct RunnerEntry {
  const char* component;
  Runner run;
};

// Add a line here when a component gets a runner.
const std::vector<RunnerEntry> kRunners = {
    {"text_encoder", verify_text_encoder},
    {"tokenizer", verify_tokenizer},
    {"unet", verify_unet},
    {"transformer", verify_transformer},
    {"lora", verify_lora},
    {"vae", verify_vae},
    {"scheduler", verify_scheduler},
    {"pipeline", verify_pipeline},
    {"controlnet", verify_controlnet},
    {"preprocessing", verify_preprocessing},
    {"processor", verify_qwenimage},  // Qwen2-VL's image processor
};

Runner find_runner(const std::string& component) {
  for (const auto& r : kRunners)
    if (component == r.component) return r.run;
  return nullptr;
}

}  // namespace

std::vector<std::string> supported_components() {
  std::vector<std::string> out;
  for (const auto& r : kRunners) out.push_back(r.component);
  return out;
}

CaseResult run_case(const GoldenSet& set, const GoldenCase& c, const VerifyOptions& options) {
  CaseResult result;
  Runner run = find_runner(c.component);
  // A family whose networks differ from every other's has one runner for all its components.
  if (run && is_qwenimage_set(set)) run = verify_qwenimage;
  if (!run) {
    result.name = c.name;
    result.component = c.component;
    result.reason = "unsupported component '" + c.component + "'";
    return result;
  }
  try {
    torch::InferenceMode guard;
    result = run(set, c, options);
  } catch (const std::exception& e) {
    result = CaseResult();
    result.passed = false;
    result.reason = e.what();
  }
  result.name = c.name;
  result.component = c.component;
  if (result.details.empty() && result.reason.empty()) {
    result.passed = false;
    result.reason = "runner compared nothing";
  }
  return result;
}

double quantized_tolerance(quant::GgmlType type) {
  switch (type) {
    case quant::GgmlType::Q8_0:
      return 0.05;
    case quant::GgmlType::Q4_0:
      return 0.6;
    default:
      throw InvalidArgument(std::string("verify: no stated tolerance for weights in ") +
                            quant::ggml_type_traits(type).name + " (q8_0 and q4_0 have one)");
  }
}

bool quantizable_component(const std::string& component) {
  return component == "unet" || component == "transformer";
}

std::vector<CaseResult> run_all(const GoldenSet& set, const VerifyOptions& options) {
  set.check_model_files();
  if (options.weights) quantized_tolerance(*options.weights);  // refused before any case runs
  std::vector<CaseResult> out;
  for (const auto& c : set.cases) {
    if (!options.components.empty() &&
        std::find(options.components.begin(), options.components.end(), c.component) ==
            options.components.end())
      continue;
    if (options.weights && !quantizable_component(c.component)) continue;
    out.push_back(run_case(set, c, options));
  }
  return out;
}

}  // namespace diffuse::verify
