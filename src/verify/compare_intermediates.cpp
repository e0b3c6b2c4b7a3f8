#include "verify/compare_intermediates.h"

#include <torch/torch.h>

#include "verify/verify.h"

namespace diffuse::verify {

namespace {

// The case's tolerance, or with `relative_rms` > 0 (quantized weights) a relative RMS bound.
Comparison compare_output(const std::string& name, const torch::Tensor& got,
                          const torch::Tensor& expected, double atol, double rtol,
                          double relative_rms) {
  return relative_rms > 0 ? compare_relative_rms(name, got, expected, relative_rms)
                          : compare(name, got, expected, atol, rtol);
}

}  // namespace

void compare_intermediates(CaseResult& result, const CaseTensors& tensors,
                           const models::Intermediates& captured, double atol, double rtol,
                           double relative) {
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
    result.add(name, compare_output(name, got, expected, atol, rtol, relative));
  }
  // After the comparisons: CaseResult::add starts from "passed" only while details is empty.
  for (const auto& name : skipped)
    result.details.push_back(name + ": not captured by the engine (skipped)");
}

CaseResult compare_network_outputs(const GoldenCase& c, const CaseTensors& tensors,
                                   const torch::Tensor& out, const models::Intermediates& captured,
                                   std::optional<quant::GgmlType> quantized) {
  const double relative = quantized ? quantized_tolerance(*quantized) : 0.0;
  const double atol = c.tol("atol", 1e-4), rtol = c.tol("rtol", 0.0);
  CaseResult result;
  result.add("out", compare_output("out", out, tensors.get("out"), atol, rtol, relative));
  compare_intermediates(result, tensors, captured, atol, rtol, relative);
  return result;
}

}  // namespace diffuse::verify
