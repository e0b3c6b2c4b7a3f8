#include "verify/compare_intermediates.h"

#include <torch/torch.h>

namespace diffuse::verify {

void compare_intermediates(CaseResult& result, const CaseTensors& tensors,
                           const models::Intermediates& captured, double atol, double rtol) {
  const std::string prefix = "inter.";
  std::vector<std::string> skipped;
  for (const auto& name : tensors.names_with_prefix(prefix)) {
    auto it = captured.find(name.substr(prefix.size()));
    if (it == captured.end()) {
      skipped.push_back(name);
      continue;
    }
    auto expected = tensors.get(name);
    auto got = it->second;
    if (expected.dim() > 0 && got.dim() == expected.dim() && expected.size(0) < got.size(0))
      got = got.narrow(0, 0, expected.size(0));
    result.add(name, compare(name, got, expected, atol, rtol));
  }
  // After the comparisons: CaseResult::add starts from "passed" only while details is empty.
  for (const auto& name : skipped)
    result.details.push_back(name + ": not captured by the engine (skipped)");
}

CaseResult compare_network_outputs(const GoldenCase& c, const CaseTensors& tensors,
                                   const torch::Tensor& out,
                                   const models::Intermediates& captured) {
  const double atol = c.tol("atol", 1e-4), rtol = c.tol("rtol", 0.0);
  CaseResult result;
  result.add("out", compare("out", out, tensors.get("out"), atol, rtol));
  compare_intermediates(result, tensors, captured, atol, rtol);
  return result;
}

}  // namespace diffuse::verify
