// Runs golden cases through the engine: `diffuse verify` and the golden tests share this.
#pragma once
#include <torch/types.h>

#include <string>
#include <vector>

#include "verify/golden.h"

namespace diffuse::verify {

struct VerifyOptions {
  torch::Device device = torch::kCPU;
  std::vector<std::string> components;  // empty = all
};

// Runs one case; never throws: errors become a failed result with the message as reason.
// A component without a runner fails with reason "unsupported component".
CaseResult run_case(const GoldenSet& set, const GoldenCase& c, const VerifyOptions& options);
// Runs every case whose component is selected, after checking the set's listed model files
// (FormatError "golden file corrupted: ..." if one differs; case files are checked as read).
std::vector<CaseResult> run_all(const GoldenSet& set, const VerifyOptions& options);
// Components this build can verify.
std::vector<std::string> supported_components();

}  // namespace diffuse::verify
