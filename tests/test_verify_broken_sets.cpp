// `diffuse verify` on damaged copies of the shared golden sets (issue 18): an empty set, a
// case file whose bytes no longer match the sha256 cases.json lists, params of the wrong type
// and case files outside the folder are errors, never "passed" or an engine mismatch. Each
// test copies what it needs into a temp folder; the shared sets are only read.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "diffuse/errors.h"
#include "io/sha256.h"
#include "test_util.h"
#include "verify/verify.h"

namespace fs = std::filesystem;

namespace diffuse {
namespace test_verify_broken_sets {

using nlohmann::json;

// A copy of the first case of `component` in the default golden set (whatever its name), with
// its case file and every listed file outside the case files (the model: a tokenizer case
// needs its vocabulary), cases.json cut down to that case. `found` is false when the set has
// no case of that component.
struct CopiedSet {
  test::TempDir dir;
  json index;
  bool found = false;

  explicit CopiedSet(const std::string& component) {
    const fs::path src = test::golden_dir();
    std::ifstream in(src / "cases.json");
    index = json::parse(in);
    json cases = json::array(), files = json::object();
    std::vector<std::string> case_files, copy;
    for (const auto& c : index["cases"]) {
      case_files.push_back(c["file"].get<std::string>());
      if (!found && c["component"] == component) {
        found = true;
        cases.push_back(c);
        copy.push_back(c["file"].get<std::string>());
      }
    }
    const json listed = index.value("files", json::object());
    for (const auto& [name, entry] : listed.items())
      if (std::find(case_files.begin(), case_files.end(), name) == case_files.end())
        copy.push_back(name);
    for (const auto& name : copy) {
      fs::create_directories((dir.path() / name).parent_path());
      fs::copy_file(src / name, dir.path() / name);
      if (index.contains("files") && index["files"].contains(name))
        files[name] = index["files"][name];
    }
    index["cases"] = cases;
    index["files"] = files;
    save();
  }
  void save() const { std::ofstream(dir.path() / "cases.json") << index.dump(1); }
  std::string path() const { return dir.path().string(); }
  json& the_case() { return index["cases"][0]; }
  verify::CaseResult run_first_case() const {
    const auto set = verify::GoldenSet::load(path());
    return verify::run_case(set, set.cases.at(0), verify::VerifyOptions{});
  }
};

struct CliRun {
  int exit_code = -1;
  std::string output;  // stdout and stderr
};

CliRun run_verify(const std::vector<std::string>& args) {
  std::string cmd = std::string("'") + DIFFUSE_CLI_PATH + "' verify";
  for (const auto& a : args) cmd += " '" + a + "'";  // temp paths: no quotes inside
  cmd += " 2>&1 </dev/null";
  CliRun r;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf;
  for (size_t n; (n = std::fread(buf.data(), 1, buf.size(), p)) > 0;)
    r.output.append(buf.data(), n);
  const int status = ::pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

bool have_golden_set() {
  return fs::exists(fs::path(test::golden_dir()) / "cases.json");
}

#define SKIP_WITHOUT_GOLDEN_SET() \
  if (!have_golden_set()) GTEST_SKIP() << "no golden set at " << test::golden_dir()
#define SKIP_WITHOUT_CASE(set, component) \
  if (!(set).found) GTEST_SKIP() << "no '" component "' case in " << test::golden_dir()

TEST(VerifyBrokenGoldenSet, AnEmptySetOrSelectionFailsInsteadOfPassingNothing) {
  SKIP_WITHOUT_GOLDEN_SET();
  CopiedSet set("scheduler");
  SKIP_WITHOUT_CASE(set, "scheduler");
  auto r = run_verify({set.path(), "--component", "unet"});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("--component unet: no case in " + set.path() +
                          "/cases.json has that component (expected one of 'scheduler')"),
            std::string::npos)
      << r.output;

  set.index["cases"] = json::array();
  set.save();
  r = run_verify({set.path()});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find(set.dir.file("cases.json") + ": 'cases' is empty"), std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("0 failed"), std::string::npos) << r.output;
}

TEST(VerifyBrokenGoldenSet, ACorruptedCaseFileIsReportedAsSuchAndFails) {
  SKIP_WITHOUT_GOLDEN_SET();
  CopiedSet set("scheduler");
  SKIP_WITHOUT_CASE(set, "scheduler");
  const auto intact = set.run_first_case();
  ASSERT_TRUE(intact.passed) << intact.reason;

  // One bit of the last stored value: still a well-formed case file.
  const std::string relative = set.the_case()["file"];
  const std::string file = set.dir.file(relative);
  std::string bytes;
  {
    std::ifstream in(file, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  bytes.back() ^= 1;
  std::ofstream(file, std::ios::binary) << bytes;

  const auto damaged = set.run_first_case();
  EXPECT_FALSE(damaged.passed);
  const std::string want = set.index["files"][relative]["sha256"];
  EXPECT_EQ(damaged.reason, "golden file corrupted: " + file + ": sha256 " + io::sha256_hex(bytes) +
                                ", cases.json says " + want);
  const auto r = run_verify({"--golden", set.path()});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("golden file corrupted: " + file), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("0 passed, 1 failed"), std::string::npos) << r.output;
}

TEST(VerifyBrokenGoldenSet, ParamsOfTheWrongTypeAreRefused) {
  SKIP_WITHOUT_GOLDEN_SET();
  // The tokenizer case ran (and passed) with any params: it reads its prompts from the case
  // file and skipped a token id that was not an integer.
  CopiedSet set("tokenizer");
  SKIP_WITHOUT_CASE(set, "tokenizer");
  ASSERT_TRUE(set.run_first_case().passed);

  set.the_case()["params"]["pad_token_id"] = "0";
  set.save();
  auto r = set.run_first_case();
  EXPECT_FALSE(r.passed);
  const std::string name = set.the_case()["name"];
  EXPECT_EQ(r.reason, set.dir.file("cases.json") + ": case '" + name +
                          "': params.pad_token_id is \"0\", expected an integer");

  set.the_case()["params"] = "garbage";
  set.save();
  const auto msg = test::expect_throw<FormatError>([&] { verify::GoldenSet::load(set.path()); });
  EXPECT_EQ(msg, set.dir.file("cases.json") + ": case '" + name +
                     "': 'params' is \"garbage\", expected an object");
  const auto cli = run_verify({set.path()});
  EXPECT_EQ(cli.exit_code, 1) << cli.output;
  EXPECT_NE(cli.output.find("'params' is \"garbage\""), std::string::npos) << cli.output;
}

TEST(VerifyBrokenGoldenSet, ACaseFileOutsideTheFolderIsRefused) {
  SKIP_WITHOUT_GOLDEN_SET();
  CopiedSet set("scheduler");
  SKIP_WITHOUT_CASE(set, "scheduler");
  const std::string name = set.the_case()["name"];
  for (const std::string outside : {"../../../etc/passwd", "/etc/passwd"}) {
    SCOPED_TRACE(outside);
    set.the_case()["file"] = outside;
    set.save();
    const auto r = run_verify({set.path()});
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_NE(r.output.find(set.dir.file("cases.json") + ": case '" + name + "' file '" + outside +
                            "' is not a file name inside the folder"),
              std::string::npos)
        << r.output;
  }
}

}  // namespace test_verify_broken_sets
}  // namespace diffuse
