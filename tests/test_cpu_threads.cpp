// The CPU thread policy of a generation (small steps run on one thread) and the measurement
// of what other processes took meanwhile (/proc/stat less this process), with its reports.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include "cli_run.h"
#include "device/cpu_load.h"
#include "device/cpu_threads.h"
#include "pipeline/cpu_report.h"
#include "test_util.h"

using namespace diffuse;

namespace test_cpu_threads {

const std::string kDemo = std::string(DIFFUSE_SOURCE_DIR) + "/models/demo";

TEST(CpuThreads, SmallStepsRunOnOneThreadUnlessTheUserChose) {
  EXPECT_EQ(device::threads_for_step_work(0.4e9, 8, false), 1);
  EXPECT_EQ(device::threads_for_step_work(device::kSmallStepFlops, 8, false), 8);
  EXPECT_EQ(device::threads_for_step_work(1.6e12, 8, false), 8);
  EXPECT_EQ(device::threads_for_step_work(0.4e9, 8, true), 8);  // DIFFUSE_THREADS=8 is kept
  EXPECT_EQ(device::threads_for_step_work(0.4e9, 0, true), 1);
  // A large step keeps the count in effect, which a library user may have set after the engine
  // configured its own (as the pipelines do, first).
  device::configure_cpu_threads();
  device::ScopedCpuThreads three(3);
  EXPECT_EQ(device::threads_for_step_work(1.6e12), 3);
}

TEST(CpuThreads, ScopedThreadsRestoreTheCountBefore) {
  device::configure_cpu_threads();
  const int before = at::get_num_threads();
  {
    device::ScopedCpuThreads one(1);
    EXPECT_EQ(at::get_num_threads(), 1);
    {
      device::ScopedCpuThreads two(2);
      EXPECT_EQ(at::get_num_threads(), 2);
    }
    EXPECT_EQ(at::get_num_threads(), 1);
  }
  EXPECT_EQ(at::get_num_threads(), before);
}

TEST(CpuLoad, ProcStatAllCpuLineGivesBusyAndStealSeconds) {
  const std::string text =
      "cpu  100 20 30 4000 50 6 7 8 0 0\n"
      "cpu0 60 10 10 2000 25 3 3 4 0 0\n"
      "cpu1 40 10 20 2000 25 3 4 4 0 0\n"
      "intr 12345\n";
  auto t = device::parse_proc_stat(text, 100);
  ASSERT_TRUE(t);
  EXPECT_DOUBLE_EQ(t->busy_s, (100 + 20 + 30 + 6 + 7) / 100.0);  // idle and iowait are not busy
  EXPECT_DOUBLE_EQ(t->steal_s, 0.08);
  auto only1 = device::parse_proc_stat(text, 100, {1});  // a process pinned to CPU 1
  ASSERT_TRUE(only1);
  EXPECT_DOUBLE_EQ(only1->busy_s, (40 + 10 + 20 + 3 + 4) / 100.0);
  EXPECT_DOUBLE_EQ(only1->steal_s, 0.04);
  auto both = device::parse_proc_stat(text, 100, {0, 1});
  ASSERT_TRUE(both);
  EXPECT_DOUBLE_EQ(both->busy_s, t->busy_s);
  // A kernel without the steal column (before 2.6.11) has four or more fields.
  auto old = device::parse_proc_stat("cpu 10 0 10 500\n", 100);
  ASSERT_TRUE(old);
  EXPECT_DOUBLE_EQ(old->busy_s, 0.2);
  EXPECT_DOUBLE_EQ(old->steal_s, 0);
}

TEST(CpuLoad, MalformedProcStatIsRejected) {
  const std::vector<std::string> bads = {"",
                                         "\n",
                                         "intr 1 2 3\n",
                                         "cpu\n",
                                         "cpu 1 2 3\n",
                                         "cpu a b c d\n",
                                         "cpu 1 2 -3 4\n",
                                         "cpu 1 2 nan 4\n",
                                         "cpu 1 2 inf 4\n",
                                         std::string(100000, 'x')};
  for (const auto& bad : bads) {
    EXPECT_FALSE(device::parse_proc_stat(bad, 100)) << bad.substr(0, 40);
  }
  const std::string two = "cpu 1 1 1 1\ncpu0 1 1 1 1\ncpu1 1 1 1 1\n";
  EXPECT_FALSE(device::parse_proc_stat(two, 100, {2}));  // a CPU without a line
  EXPECT_FALSE(device::parse_proc_stat("cpu 1 1 1 1\ncpuX 1 1 1 1\n", 100, {0}));
  EXPECT_FALSE(device::parse_proc_stat("cpu 1 1 1 1\ncpu99999999999 1 1 1 1\n", 100, {0}));
  EXPECT_FALSE(device::parse_proc_stat(two, 0));
}

TEST(CpuLoad, ShareIsBusyTimeLessOwnOverWallTime) {
  device::CpuTimes a, b;
  a.wall_s = 10;
  b.wall_s = 12;
  a.busy_s = 100;
  b.busy_s = 104;  // 2 CPUs busy for 2 s
  a.self_s = 5;
  b.self_s = 6;  // of which this process 0.5 CPU
  a.steal_s = 1;
  b.steal_s = 1.2;
  a.cpus = b.cpus = 2;
  auto s = device::cpu_share_between(a, b, 2);
  EXPECT_EQ(s.threads, 2);
  EXPECT_EQ(s.cpus, 2);
  EXPECT_DOUBLE_EQ(s.self, 0.5);
  EXPECT_DOUBLE_EQ(s.others, 1.5);
  EXPECT_DOUBLE_EQ(s.steal, 0.1);
  EXPECT_NEAR(s.free(), 0.4, 1e-12);
  EXPECT_TRUE(s.crowded());
  // Ticks against microseconds: a small negative difference is none; nothing exceeds the CPUs.
  b.busy_s = 100.5;
  b.self_s = 5.5;
  b.steal_s = 100;
  s = device::cpu_share_between(a, b, 2);
  EXPECT_DOUBLE_EQ(s.others, 0);
  EXPECT_DOUBLE_EQ(s.steal, 2);
  // No time passed: unknown, and then never crowded.
  s = device::cpu_share_between(a, a, 2);
  EXPECT_EQ(s.others, -1);
  EXPECT_FALSE(s.crowded());
  EXPECT_EQ(s.free(), 2);
}

TEST(CpuLoad, CrowdedOnlyWithMoreThreadsThanFreeCpus) {
  CpuShare s;
  s.cpus = 2;
  s.threads = 2;
  s.steal = 0;
  s.others = 0.3;
  EXPECT_FALSE(s.crowded());
  EXPECT_EQ(pipeline::cpu_share_note(s), "");
  s.others = 1.0;
  EXPECT_TRUE(s.crowded());
  const std::string note = pipeline::cpu_share_note(s);
  EXPECT_NE(note.find("other processes used 1.0 of 2 CPUs"), std::string::npos) << note;
  EXPECT_NE(note.find("DIFFUSE_THREADS=1"), std::string::npos) << note;
  s.threads = 1;  // one thread waits for nobody
  EXPECT_FALSE(s.crowded());
  auto j = device::cpu_share_json(s);
  EXPECT_EQ(j["threads"], 1);
  EXPECT_EQ(j["other_processes"], 1.0);
  EXPECT_EQ(j["crowded"], false);
  EXPECT_TRUE(device::cpu_share_json(CpuShare{})["other_processes"].is_null());
}

TEST(CpuLoad, MeterSeesThisProcessWork) {
  if (!device::sample_cpu_times()) GTEST_SKIP() << "no /proc/stat here";
  device::CpuShareMeter meter(1);
  auto x = torch::randn({256, 256});
  for (int i = 0; i < 200; ++i) x = torch::tanh(x.mm(x) * 1e-3);
  const auto s = meter.share();
  EXPECT_EQ(s.threads, 1);
  EXPECT_GE(s.cpus, 1);
  EXPECT_GT(s.self, 0);
  EXPECT_GE(s.others, 0);
  EXPECT_GE(s.steal, 0);
  EXPECT_LE(s.self, s.cpus);
}

// The demo model at its size is a small step: one thread unless the user chose, and the JSON
// summary says what the generation had.
TEST(CpuThreadsCli, DemoModelRunsOnOneThreadUnlessDiffuseThreadsIsSet) {
  test::TempDir dir;
  const std::vector<std::string> args = {
      "txt2img", "--model", kDemo, "--prompt", "a red circle",    "--steps",
      "2",       "--seed",  "1",   "--out",    dir.file("a.png"), "--json"};
  auto run = [&](const std::string& env) {
    auto r = test::run_cli(args, dir, env);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return nlohmann::json::parse(r.out, nullptr, false);
  };
  auto policy = run("env -u OMP_NUM_THREADS -u MKL_NUM_THREADS -u DIFFUSE_THREADS");
  ASSERT_FALSE(policy.is_discarded());
  EXPECT_EQ(policy["cpu"]["threads"], 1) << policy.dump();
  EXPECT_GE(policy["cpu"]["cpus"].get<int>(), 1);
  auto chosen = run("env -u OMP_NUM_THREADS -u MKL_NUM_THREADS DIFFUSE_THREADS=2");
  ASSERT_FALSE(chosen.is_discarded());
  EXPECT_EQ(chosen["cpu"]["threads"], 2) << chosen.dump();
  if (!policy["cpu"]["other_processes"].is_null()) {
    EXPECT_GE(policy["cpu"]["other_processes"].get<double>(), 0);
  }
  // The stage benchmark runs what a generation runs.
  auto bench = test::run_cli({"bench", "-m", kDemo, "--steps", "1", "--warmup", "0",
                              "--no-roofline", "--no-vae", "--no-text-encoder", "--json"},
                             dir, "env -u OMP_NUM_THREADS -u MKL_NUM_THREADS -u DIFFUSE_THREADS");
  ASSERT_EQ(bench.exit_code, 0) << bench.err;
  auto j = nlohmann::json::parse(bench.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << bench.out;
  EXPECT_EQ(j["threads"], 1) << bench.out;
}

}  // namespace test_cpu_threads
