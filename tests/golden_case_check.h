// Shared by the golden-set test suites: one case through the verify code, and readable gtest
// parameter names. Header-only: the parser test binary links no verify runners.
#pragma once
#include <gtest/gtest.h>

#include <cctype>
#include <iostream>
#include <string>

#include "verify/verify.h"

namespace diffuse::test {

// Runs the case, prints its details and expects it to pass.
inline void expect_golden_case_passes(const verify::GoldenSet& set, const verify::GoldenCase& c) {
  auto result = verify::run_case(set, c, verify::VerifyOptions{});
  for (const auto& d : result.details) std::cout << "  " << d << "\n";
  std::cout << "  max_abs_err=" << result.max_abs_err << "\n";
  EXPECT_TRUE(result.passed) << result.reason;
}

// gtest parameter names from case names (non-alphanumerics become '_').
inline std::string case_param_name(const ::testing::TestParamInfo<std::string>& info) {
  std::string s = info.param;
  for (auto& ch : s)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return s;
}

}  // namespace diffuse::test
