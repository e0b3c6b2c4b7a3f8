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

}  // namespace diffuse::verify
