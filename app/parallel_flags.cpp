#include "parallel_flags.h"

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <random>

#include "device/device.h"
#include "flag_checks.h"
#include "parallel/branch_split.h"
#include "parallel/cfg_launch.h"
#include "parallel/process_group.h"
#include "parallel/worker_processes.h"

namespace diffuse::app {
namespace {

// Stable Diffusion's guidance batch: [negative; positive].
constexpr int kSdBranches = 2;

std::chrono::milliseconds to_ms(double seconds) {
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
}

}  // namespace

void add_parallel_flags(CLI::App& app, ParallelFlags& f) {
  auto* devices = app.add_option(
      "--devices", f.devices,
      "CFG-parallel: one process per device, e.g. cpu,cpu or cuda:0,cuda:1 (rank 0 computes the "
      "negative branch, rank 1 the positive; Gloo on cpu, NCCL on cuda, HCCL on npu)");
  if (auto* device = app.get_option_no_throw("--device")) devices->excludes(device);
  app.add_option("--parallel-timeout", f.timeout_s,
                 "CFG-parallel: seconds a rank waits for the others at each step before failing")
      ->capture_default_str()
      ->check(number_range(1.0, 86400.0, "seconds"));
  // Hidden (empty group): set by the launcher in the workers it starts.
  app.add_option(parallel::kWorkerRankFlag, f.worker_rank)->group("")->needs(devices);
  app.add_option(parallel::kStoreFlag, f.store)->group("");
  app.add_option("--cfg-hash-log", f.hash_log)->group("");
}

std::vector<torch::Device> check_parallel_flags(const ParallelFlags& f,
                                                const GenerationConfig& config, bool hidream) {
  if (hidream)
    throw InvalidArgument(
        "--devices: CFG-parallel runs Stable Diffusion models for now, not "
        "HiDream");
  auto devices = parallel::parse_device_list(f.devices, "--devices");
  parallel::check_cfg_parallel_run(devices.size(), kSdBranches, config.guidance_scale, "--devices");
  if (f.is_worker() && (f.worker_rank >= static_cast<int>(devices.size()) || f.store.empty()))
    throw InvalidArgument("CFG-parallel worker: rank " + std::to_string(f.worker_rank) +
                          " or store missing (these flags are set by the launcher)");
  return devices;
}

int run_parallel_launcher(const std::vector<torch::Device>& devices,
                          const GenerationConfig& config) {
  parallel::CfgLaunch launch;
  launch.devices = devices;
  launch.command = parallel::own_command_line();
  if (!config.seed) {
    std::random_device rd;
    const uint64_t seed = (static_cast<uint64_t>(rd()) << 32 | rd()) & ((1ull << 53) - 1);
    launch.extra_args = {"--seed", std::to_string(seed)};
  }
  try {
    parallel::launch_cfg_workers(launch);
  } catch (const parallel::WorkersInterrupted& e) {
    // The workers are reaped and the temporary store is gone: exit as the signal would have.
    std::cerr << "\ninterrupted\n";
    return 128 + e.signal();
  }
  return 0;
}

std::shared_ptr<parallel::CfgGroup> join_cfg_group(const ParallelFlags& f,
                                                   const std::vector<torch::Device>& devices) {
  parallel::GroupOptions o;
  o.rank = f.worker_rank;
  o.world = static_cast<int>(devices.size());
  o.device = devices[static_cast<size_t>(f.worker_rank)];
  o.store_file = f.store;
  o.timeout = to_ms(f.timeout_s);
  return parallel::connect_group(o);
}

StepCallback worker_step_callback(const ParallelFlags& f, StepCallback inner) {
  int fault_rank = -1, fault_step = -1;
  std::string fault_kind;
  if (const char* env = std::getenv("DIFFUSE_TEST_CFG_FAULT"); env && *env) {
    const std::string s = env;
    const auto a = s.find(':'), b = s.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos)
      throw InvalidArgument("DIFFUSE_TEST_CFG_FAULT must be RANK:STEP:exit|hang, got '" + s + "'");
    fault_rank = std::stoi(s.substr(0, a));
    fault_step = std::stoi(s.substr(a + 1, b - a - 1));
    fault_kind = s.substr(b + 1);
  }
  auto log = std::make_shared<std::ofstream>();
  if (!f.hash_log.empty())
    log->open(f.hash_log + ".rank" + std::to_string(f.worker_rank), std::ios::app);
  const int rank = f.worker_rank;
  return [=](const StepEvent& e) {
    if (log->is_open() && e.latents)
      *log << e.step << " " << std::hex << parallel::tensor_hash(*e.latents) << std::dec
           << std::endl;
    if (rank == fault_rank && e.step + 1 == fault_step) {
      if (fault_kind == "hang")
        for (;;) ::pause();  // until the launcher's SIGTERM
      ::_exit(3);
    }
    return inner ? inner(e) : true;
  };
}

int run_as_worker(const ParallelFlags& f, const std::function<int()>& run) {
  try {
    return run();
  } catch (const std::exception& e) {
    throw Error("rank " + std::to_string(f.worker_rank) + ": " + e.what());
  }
}

}  // namespace diffuse::app
