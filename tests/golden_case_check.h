// Shared by the golden-set test suites: one case through the verify code, and readable gtest
// parameter names. Header-only: the parser test binary links no verify runners.
#pragma once
#include <gtest/gtest.h>

#include <cctype>
#include <functional>
#include <iostream>
#include <set>
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

// Every case of the set at `dir` passes, and every output the reference recorded for a case of
// one of `components` (every case when empty) was compared, not only the final image; outputs
// `skip` names (the reference's debugging intermediates, the noise it drew) may go uncompared.
inline void expect_golden_set_passes(const std::string& dir,
                                     const std::set<std::string>& components = {},
                                     const std::function<bool(const std::string&)>& skip = {}) {
  const auto set = verify::GoldenSet::load(dir);
  const auto results = verify::run_all(set, verify::VerifyOptions{});
  ASSERT_EQ(results.size(), set.cases.size());
  for (const auto& r : results) {
    EXPECT_TRUE(r.passed) << r.name << ": " << r.reason;
    if (!r.passed)
      for (const auto& d : r.details) std::cout << "  " << r.name << " " << d << "\n";
    const auto* c = set.find(r.name);
    ASSERT_NE(c, nullptr);
    if (!components.empty() && !components.count(c->component)) continue;
    for (const auto& [name, spec] : c->raw.at("outputs").items()) {
      if (skip && skip(name)) continue;
      bool compared = false;
      for (const auto& d : r.details) compared = compared || d.rfind(name + ":", 0) == 0;
      EXPECT_TRUE(compared) << r.name << ": " << name << " was not compared";
    }
  }
}

// gtest parameter names from case names (non-alphanumerics become '_').
inline std::string case_param_name(const ::testing::TestParamInfo<std::string>& info) {
  std::string s = info.param;
  for (auto& ch : s)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return s;
}

}  // namespace diffuse::test
