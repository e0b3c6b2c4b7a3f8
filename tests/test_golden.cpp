// Runs every case of the golden set (cases.json) through the same code as `diffuse verify`.
// Cases of components this build cannot verify yet are skipped, not passed.
#include <gtest/gtest.h>

#include <algorithm>

#include "golden_case_check.h"
#include "test_util.h"
#include "verify/verify.h"

namespace diffuse {
namespace test_golden {

std::vector<std::string> case_names() {
  std::vector<std::string> names;
  try {
    for (const auto& c : verify::GoldenSet::load(test::golden_dir()).cases) names.push_back(c.name);
  } catch (const std::exception&) {
    names.push_back("<golden set could not be loaded>");
  }
  return names;
}

class GoldenCaseTest : public ::testing::TestWithParam<std::string> {};

TEST_P(GoldenCaseTest, MatchesReference) {
  auto set = verify::GoldenSet::load(test::golden_dir());
  const auto* c = set.find(GetParam());
  ASSERT_NE(c, nullptr) << "case " << GetParam() << " not in " << set.dir;
  auto supported = verify::supported_components();
  if (std::find(supported.begin(), supported.end(), c->component) == supported.end())
    GTEST_SKIP() << "component '" << c->component << "' has no runner yet";
  test::expect_golden_case_passes(set, *c);
}

INSTANTIATE_TEST_SUITE_P(Golden, GoldenCaseTest, ::testing::ValuesIn(case_names()),
                         test::case_param_name);

TEST(GoldenSet, LoadsAndListsCases) {
  auto set = verify::GoldenSet::load(test::golden_dir());
  EXPECT_FALSE(set.cases.empty());
  for (const auto& c : set.cases) EXPECT_TRUE(std::filesystem::exists(c.file)) << c.file;
}

}  // namespace test_golden
}  // namespace diffuse
