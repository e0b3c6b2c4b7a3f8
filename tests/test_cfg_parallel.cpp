// CFG-parallel (src/parallel): the guidance branches split over processes that all-gather
// their noise predictions over Gloo on 127.0.0.1. The library path (two ranks as two threads
// of this process), the CLI's `--devices cpu,cpu` (two worker processes), workers that die or
// hang, and bad device lists. One intra-op thread per rank (test_util.cpp sets DIFFUSE_THREADS).
#include <dirent.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <torch/torch.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <exception>
#include <fstream>
#include <sstream>
#include <thread>

#include "cli_run.h"
#include "diffuse/image.h"
#include "diffuse/pipeline.h"
#include "parallel/branch_split.h"
#include "parallel/cfg_launch.h"
#include "parallel/process_group.h"
#include "parallel/replicated.h"
#include "pipeline/stable_diffusion.h"
#include "rank_group_test_util.h"
#include "test_util.h"

namespace diffuse {
namespace test_cfg_parallel {

const std::string kDemo = std::string(DIFFUSE_SOURCE_DIR) + "/models/demo";

using test::with_group;

TEST(CfgParallel, BranchesAreSplitContiguouslyOverTheRanks) {
  auto range = [](int branches, int world, int rank) {
    auto r = parallel::branches_of_rank(branches, world, rank);
    return std::make_pair(r.first, r.count);
  };
  EXPECT_EQ(range(2, 2, 0), std::make_pair(0, 1));  // SD: negative
  EXPECT_EQ(range(2, 2, 1), std::make_pair(1, 1));  // SD: positive
  EXPECT_EQ(range(3, 2, 0), std::make_pair(0, 2));  // HiDream-E1 on two devices
  EXPECT_EQ(range(3, 2, 1), std::make_pair(2, 1));
  EXPECT_EQ(range(3, 3, 2), std::make_pair(2, 1));
  EXPECT_THROW(parallel::check_branch_split(2, 1), InvalidArgument);
  EXPECT_THROW(parallel::check_branch_split(2, 3), InvalidArgument);
}

// The same gather serves two and three branches, even and uneven splits, over real Gloo.
TEST(CfgParallel, GatherRebuildsTheWholeBatchForAnyNumberOfBranches) {
  SKIP_WITHOUT_CPU_COLLECTIVES();
  for (const auto& [branch_count, rank_count] : {std::pair{2, 2}, {3, 2}, {3, 3}}) {
    // Copies: C++17 lambdas cannot capture structured bindings.
    const int branches = branch_count, world = rank_count;
    SCOPED_TRACE(std::to_string(branches) + " branches on " + std::to_string(world));
    // Branch b's rows are all b (2 rows per branch).
    auto batched = torch::arange(branches).repeat_interleave(2).to(torch::kFloat32).view({-1, 1});
    with_group(world, [&](parallel::RankGroup& g) {
      parallel::BranchShard shard(g, branches);
      auto mine = shard.local(batched);
      EXPECT_EQ(mine.size(0), 2 * shard.range().count);
      auto whole = shard.gather(mine * 1.0);
      EXPECT_TRUE(torch::equal(whole, batched));
      parallel::check_replicated(g, batched, "test tensor");
    });
  }
}

TEST(CfgParallel, RanksThatDivergeAreReported) {
  SKIP_WITHOUT_CPU_COLLECTIVES();
  std::string message;
  try {
    with_group(2, [&](parallel::RankGroup& g) {
      parallel::check_replicated(g, torch::full({3}, g.rank()), "latents");
    });
  } catch (const Error& e) {
    message = e.what();
  }
  EXPECT_NE(message.find("latents"), std::string::npos) << message;
}

// The library path: two pipelines (one per rank) with a group set compute the same latents
// as one pipeline with the batched CFG run; both ranks hold identical latents at every step.
// A guided demo generation, and the CPU float32 load the library-path tests run it with.
GenerationConfig guided_demo_config(int steps, uint64_t seed) {
  GenerationConfig g;
  g.prompts = {"a red circle on the left"};
  g.negative_prompts = {"blurry"};
  g.steps = steps;
  g.seed = seed;
  return g;
}
LoadOptions cpu_fp32_load() {
  LoadOptions lo;
  lo.device = "cpu";
  lo.dtype = "fp32";
  return lo;
}

TEST(CfgParallel, TwoRanksMatchTheBatchedRunAndAgreeAtEveryStep) {
  SKIP_WITHOUT_CPU_COLLECTIVES();
  GenerationConfig g = guided_demo_config(6, 11);
  g.guidance_scale = 7.0;
  const LoadOptions lo = cpu_fp32_load();
  auto single = Text2Image::load(kDemo, lo).generate(g);

  std::array<GenerationResult, 2> results;
  std::array<std::vector<uint64_t>, 2> hashes;
  with_group(2, [&](parallel::RankGroup& group) {
    auto pipe = Text2Image::load(kDemo, lo);
    pipe.impl()->set_cfg_group(std::shared_ptr<parallel::RankGroup>(&group, [](auto*) {}));
    const auto r = static_cast<size_t>(group.rank());
    results[r] = pipe.generate(g, [&](const StepEvent& e) {
      hashes[r].push_back(parallel::tensor_hash(*e.latents));
      return true;
    });
  });
  ASSERT_EQ(hashes[0].size(), 6u);
  EXPECT_EQ(hashes[0], hashes[1]);
  EXPECT_TRUE(torch::equal(results[0].latents, results[1].latents));
  EXPECT_EQ(results[0].images.size(), 1u);  // rank 0 decodes
  EXPECT_TRUE(results[1].images.empty());   // the others do not
  const double diff = (results[0].latents - single.latents).abs().max().item<double>();
  const double scale = single.latents.abs().max().item<double>();
  std::cout << "CFG-parallel vs batched CFG: final latents max abs diff " << diff << " (max |x| "
            << scale << ")\n";
  EXPECT_LE(diff, 1e-4);  // fp32, batch of 1 vs 2 in the UNet's kernels
}

// Token merging's auto policy times the merge on each rank; the ranks add their times, so they
// decide alike (else their latents would part at the first step) and report alike.
TEST(CfgParallel, TokenMergingPolicyDecidesAlikeOnEveryRank) {
  SKIP_WITHOUT_CPU_COLLECTIVES();
  GenerationConfig g = guided_demo_config(3, 2);
  g.token_merging.ratio = 0.5;
  const LoadOptions lo = cpu_fp32_load();
  std::array<GenerationResult, 2> results;
  with_group(2, [&](parallel::RankGroup& group) {
    auto pipe = Text2Image::load(kDemo, lo);
    pipe.impl()->set_cfg_group(std::shared_ptr<parallel::RankGroup>(&group, [](auto*) {}));
    results[static_cast<size_t>(group.rank())] = pipe.generate(g);
  });
  EXPECT_TRUE(torch::equal(results[0].latents, results[1].latents));
  EXPECT_EQ(results[0].warnings, results[1].warnings);
}

TEST(CfgParallel, AGroupNeedsGuidance) {
  SKIP_WITHOUT_CPU_COLLECTIVES();
  GenerationConfig g;
  g.prompts = {"x"};
  g.steps = 1;
  g.guidance_scale = 1.0;
  LoadOptions lo;
  lo.device = "cpu";
  EXPECT_THROW(with_group(2,
                          [&](parallel::RankGroup& group) {
                            auto pipe = Text2Image::load(kDemo, lo);
                            pipe.impl()->set_cfg_group(
                                std::shared_ptr<parallel::RankGroup>(&group, [](auto*) {}));
                            pipe.generate(g);
                          }),
               InvalidArgument);
}

// ---- the CLI: `--devices cpu,cpu` ----

using test::CliRun;
using test::run_cli;

// Processes whose command line mentions `token` (the workers of a run carry its temp dir).
int processes_mentioning(const std::string& token) {
  int found = 0;
  DIR* proc = ::opendir("/proc");
  if (!proc) return -1;
  while (auto* e = ::readdir(proc)) {
    const std::string name = e->d_name;
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream in("/proc/" + name + "/cmdline", std::ios::binary);
    std::string cmdline((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (cmdline.find(token) != std::string::npos) ++found;
  }
  ::closedir(proc);
  return found;
}

std::vector<std::string> read_lines(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  return lines;
}

std::vector<std::string> demo_args(const std::string& out, int steps = 4) {
  return {"txt2img",
          "-m",
          kDemo,
          "-p",
          "a blue square",
          "-n",
          "blurry",
          "--steps",
          std::to_string(steps),
          "--seed",
          "5",
          "-o",
          out};
}

TEST(CfgParallel, CliTwoCpuWorkersMatchOneProcess) {
  SKIP_WITHOUT_CPU_COLLECTIVES();
  test::TempDir dir;
  auto one = run_cli(demo_args(dir.file("one.png")), dir);
  ASSERT_EQ(one.exit_code, 0) << one.err;
  auto args = demo_args(dir.file("two.png"));
  args.insert(args.end(), {"--devices", "cpu,cpu", "--cfg-hash-log", dir.file("hashes")});
  auto two = run_cli(args, dir);
  ASSERT_EQ(two.exit_code, 0) << two.err;
  EXPECT_NE(two.out.find("two.png"), std::string::npos) << two.out;  // printed once, by rank 0
  EXPECT_EQ(two.out.find("two.png"), two.out.rfind("two.png")) << two.out;
  // Both ranks held the same latents after every step.
  const auto h0 = read_lines(dir.file("hashes.rank0")), h1 = read_lines(dir.file("hashes.rank1"));
  EXPECT_EQ(h0.size(), 4u);
  EXPECT_EQ(h0, h1);
  // The image equals the single-process one up to 8-bit rounding of float noise.
  EXPECT_LE(test::worst_pixel_difference(dir.file("one.png"), dir.file("two.png")), 1);
  EXPECT_EQ(processes_mentioning(dir.path().string()), 0);
}

// A worker that exits mid-run or stops answering: the run fails with a message naming it, in
// bounded time (a dead peer is seen at once; a silent one after --parallel-timeout), leaves no
// process and no output file.
TEST(CfgParallel, CliWorkerThatDiesOrHangsStopsTheRun) {
  SKIP_WITHOUT_CPU_COLLECTIVES();
  for (const std::string kind : {"exit", "hang"}) {
    SCOPED_TRACE(kind);
    test::TempDir dir;
    auto args = demo_args(dir.file("out.png"), 6);
    args.insert(args.end(), {"--devices", "cpu,cpu", "--parallel-timeout", "5"});
    auto r = run_cli(args, dir, "DIFFUSE_TEST_CFG_FAULT=1:2:" + kind);
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.err.find("CFG-parallel run failed"), std::string::npos) << r.err;
    if (kind == "exit")
      EXPECT_NE(r.err.find("rank 1 on cpu exited with status 3"), std::string::npos) << r.err;
    else {
      EXPECT_NE(r.err.find("rank 0: CFG-parallel (gloo, rank 0 of 2): exchanging noise "
                           "predictions failed"),
                std::string::npos)
          << r.err;
      // The silent worker is named, not just "a peer".
      EXPECT_NE(r.err.find("rank 1 never reached exchange"), std::string::npos) << r.err;
    }
    EXPECT_FALSE(std::filesystem::exists(dir.file("out.png")));
    EXPECT_EQ(processes_mentioning(dir.path().string()), 0);
  }
}

// Process ids whose command line mentions `token`, except `except`.
std::vector<pid_t> pids_mentioning(const std::string& token, pid_t except) {
  std::vector<pid_t> pids;
  DIR* proc = ::opendir("/proc");
  while (proc) {
    auto* e = ::readdir(proc);
    if (!e) break;
    const std::string name = e->d_name;
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream in("/proc/" + name + "/cmdline", std::ios::binary);
    std::string cmdline((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const pid_t pid = std::stoi(name);
    if (pid != except && cmdline.find(token) != std::string::npos) pids.push_back(pid);
  }
  if (proc) ::closedir(proc);
  return pids;
}

// The CLI started with `args` (and TMPDIR, when given), read until both workers are in the
// denoising loop (rank 0's "step 1/" on stderr).
struct RunningLauncher {
  pid_t pid = -1;
  int err_fd = -1;
  std::string err;
};

RunningLauncher start_launcher(std::vector<std::string> args, const std::string& tmpdir = "") {
  RunningLauncher l;
  int err_pipe[2];
  if (::pipe(err_pipe) != 0) return l;
  std::vector<char*> argv;
  std::string path = DIFFUSE_CLI_PATH;
  argv.push_back(path.data());
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  l.pid = ::fork();
  if (l.pid < 0) return l;
  if (l.pid == 0) {
    ::dup2(err_pipe[1], STDERR_FILENO);
    ::close(err_pipe[0]);
    ::close(err_pipe[1]);
    if (!tmpdir.empty()) ::setenv("TMPDIR", tmpdir.c_str(), 1);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  ::close(err_pipe[1]);
  l.err_fd = err_pipe[0];
  char buf[4096];
  for (ssize_t n;
       l.err.find("step 1/") == std::string::npos && (n = ::read(l.err_fd, buf, sizeof buf)) > 0;)
    l.err.append(buf, static_cast<size_t>(n));
  return l;
}

// The rest of its stderr, then its wait status.
int finish_launcher(RunningLauncher& l) {
  char buf[4096];
  for (ssize_t n; (n = ::read(l.err_fd, buf, sizeof buf)) > 0;)
    l.err.append(buf, static_cast<size_t>(n));
  ::close(l.err_fd);
  int status = 0;
  ::waitpid(l.pid, &status, 0);
  return status;
}

// The launcher killed outright (SIGKILL: no handler runs): its workers die with it
// (PR_SET_PDEATHSIG). Waits on pidfds, not sleeps.
TEST(CfgParallel, WorkersDieWithTheLauncher) {
  SKIP_WITHOUT_CPU_COLLECTIVES();
  // No handler of the launcher runs, so its store folder stays: in a folder of the test's own.
  test::TempDir dir, tmp;
  auto args = demo_args(dir.file("out.png"), 900);
  args.insert(args.end(), {"--devices", "cpu,cpu"});
  auto l = start_launcher(args, tmp.path().string());
  const pid_t launcher = l.pid;
  ASSERT_GT(launcher, 0);
  const std::string& err = l.err;
  ASSERT_NE(err.find("step 1/"), std::string::npos) << err;
  const auto workers = pids_mentioning(dir.path().string(), launcher);
  ASSERT_EQ(workers.size(), 2u) << err;
  std::vector<pollfd> fds;
  for (pid_t w : workers) {
    const int fd = static_cast<int>(::syscall(SYS_pidfd_open, w, 0));
    ASSERT_GE(fd, 0);
    fds.push_back({fd, POLLIN, 0});
  }
  ::kill(launcher, SIGKILL);
  finish_launcher(l);
  for (auto& p : fds) {
    // Readable once that process has exited; the bound only keeps a failure from hanging.
    EXPECT_EQ(::poll(&p, 1, 120000), 1);
    ::close(p.fd);
  }
  EXPECT_TRUE(pids_mentioning(dir.path().string(), launcher).empty());
  EXPECT_FALSE(std::filesystem::exists(dir.file("out.png")));
}

// Ctrl-C or a `kill` to the launcher alone: the workers are stopped and reaped, the temporary
// store folder is removed, and the launcher exits with 128 + the signal, as a one-process run.
TEST(CfgParallel, InterruptingTheLauncherStopsTheWorkersAndLeavesNothing) {
  SKIP_WITHOUT_CPU_COLLECTIVES();
  for (int sig : {SIGINT, SIGTERM}) {
    SCOPED_TRACE(sig);
    test::TempDir dir, tmp;
    auto args = demo_args(dir.file("out.png"), 900);
    args.insert(args.end(), {"--devices", "cpu,cpu"});
    auto l = start_launcher(args, tmp.path().string());
    ASSERT_GT(l.pid, 0);
    ASSERT_NE(l.err.find("step 1/"), std::string::npos) << l.err;
    EXPECT_FALSE(std::filesystem::is_empty(tmp.path()));  // the store folder, while running
    ::kill(l.pid, sig);
    const int status = finish_launcher(l);
    ASSERT_TRUE(WIFEXITED(status)) << l.err;
    EXPECT_EQ(WEXITSTATUS(status), 128 + sig) << l.err;
    EXPECT_NE(l.err.find("interrupted"), std::string::npos) << l.err;
    EXPECT_TRUE(std::filesystem::is_empty(tmp.path())) << l.err;
    EXPECT_TRUE(pids_mentioning(dir.path().string(), l.pid).empty());
    EXPECT_FALSE(std::filesystem::exists(dir.file("out.png")));
  }
}

TEST(CfgParallel, CliRefusesBadDeviceListsBeforeLoading) {
  std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--devices", "cpu"}, "at least two devices"},
      {{"--devices", "cpu,"}, "entry 2 is empty"},
      {{"--devices", ",cpu"}, "entry 1 is empty"},
      {{"--devices", "cpu,tpu"}, "unknown device 'tpu'"},
      // A CUDA machine has no cuda:99; one without CUDA has no cuda at all.
      {{"--devices", "cuda:0,cuda:99"},
       torch::cuda::is_available() ? "does not exist" : "not available"},
  };
  if (test::have_cpu_collectives()) {
    cases.push_back({{"--devices", "cpu,cpu,cpu"}, "3 devices for 2 guidance branches"});
    cases.push_back({{"--devices", "cpu,cpu", "--cfg-scale", "1"}, "guidance"});
    cases.push_back({{"--devices", "cpu,cpu", "--device", "cpu"}, "excludes"});
  } else {
    // A build without Gloo (PyTorch's wheels ship no Gloo headers) says so before anything else.
    cases.push_back({{"--devices", "cpu,cpu,cpu"}, "needs Gloo"});
  }
  for (const auto& [extra, expected] : cases) {
    SCOPED_TRACE(extra[1]);
    test::TempDir dir;
    auto args = demo_args(dir.file("out.png"));
    args.insert(args.end(), extra.begin(), extra.end());
    auto r = run_cli(args, dir);
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.err.find(expected), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find("loading"), std::string::npos) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_FALSE(std::filesystem::exists(dir.file("out.png")));
  }
}

}  // namespace test_cfg_parallel
}  // namespace diffuse
