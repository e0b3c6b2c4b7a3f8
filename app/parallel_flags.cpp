#include "parallel_flags.h"

#include <signal.h>
#include <unistd.h>

#include <cerrno>
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
#include "parallel/replicated.h"
#include "parallel/worker_processes.h"

namespace diffuse::app {
namespace {

// Stable Diffusion's guidance batch: [negative; positive].
constexpr int kSdBranches = 2;

std::chrono::milliseconds to_ms(double seconds) {
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
}

// A torchrun variable, or `fallback` when unset. InvalidArgument when it is not a whole number.
int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  errno = 0;
  const long n = std::strtol(v, &end, 10);
  if (errno || *end || n < 0 || n > 1 << 20)
    throw InvalidArgument(std::string("$") + name + " must be a whole number >= 0, got '" + v +
                          "'");
  return static_cast<int>(n);
}

std::string env_string(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

}  // namespace

void add_parallel_flags(CLI::App& app, ParallelFlags& f) {
  auto* devices = app.add_option(
      "--devices", f.devices,
      "Parallel run on this machine: one process per device, e.g. cpu,cpu or cuda:0,cuda:1 "
      "(Gloo on cpu, NCCL on cuda, HCCL on npu; --parallel says how they share the work)");
  if (auto* device = app.get_option_no_throw("--device")) devices->excludes(device);
  app.add_option("--parallel", f.mode,
                 "cfg: the guidance branches over the ranks; ulysses: each attention's image "
                 "tokens over the ranks (HiDream); cfg,ulysses: both, on 2 x N ranks (HiDream). "
                 "With --devices, local "
                 "processes; without, this process is one rank (torchrun's RANK, WORLD_SIZE, "
                 "LOCAL_RANK, MASTER_ADDR, MASTER_PORT or the flags below)")
      ->check(CLI::IsMember({"cfg", "ulysses", "cfg,ulysses"}));
  app.add_option("--parallel-timeout", f.timeout_s,
                 "Parallel runs: seconds a rank waits for the others at each exchange before "
                 "failing")
      ->capture_default_str()
      ->check(number_range(1.0, 86400.0, "seconds"));
  app.add_option("--parallel-join-timeout", f.join_timeout_s,
                 "Parallel runs: seconds the ranks wait for each other after loading")
      ->capture_default_str()
      ->check(number_range(1.0, 86400.0, "seconds"));
  app.add_option("--rank", f.rank, "torchrun convention: this rank (default: $RANK)")
      ->check(int_range(0, 1 << 20, "a rank"));
  app.add_option("--world-size", f.world_size,
                 "torchrun convention: the group's size (default: $WORLD_SIZE)")
      ->check(int_range(1, 1 << 20, "a group size"));
  app.add_option("--local-rank", f.local_rank,
                 "torchrun convention: the accelerator index on this host (default: "
                 "$LOCAL_RANK)")
      ->check(int_range(0, 1 << 20, "an index"));
  app.add_option("--master-addr", f.master_addr,
                 "torchrun convention: the host of rank 0's store (default: $MASTER_ADDR)");
  app.add_option("--master-port", f.master_port,
                 "torchrun convention: its port (default: $MASTER_PORT)")
      ->check(int_range(1, 65535, "a port"));
  // Hidden (empty group): set by the launcher in the workers it starts.
  app.add_option(parallel::kWorkerRankFlag, f.worker_rank)->group("")->needs(devices);
  app.add_option(parallel::kStoreFlag, f.store)->group("");
  app.add_option("--cfg-hash-log", f.hash_log)->group("");
}

ParallelMode parallel_mode(const ParallelFlags& f) {
  if (f.mode == "ulysses") return ParallelMode::kUlysses;
  if (f.mode == "cfg,ulysses") return ParallelMode::kCfgUlysses;
  return ParallelMode::kCfg;
}

void resolve_parallel_flags(ParallelFlags& f, const std::string& device_flag) {
  if (!f.active()) return;
  const bool torchrun = f.devices.empty();
  if (!torchrun) {
    if (f.rank >= 0 || f.world_size > 0 || !f.master_addr.empty() || f.master_port > 0)
      throw InvalidArgument(
          "--devices starts the ranks on this machine; --rank/--world-size/--master-addr/"
          "--master-port are for ranks started elsewhere (torchrun): not both");
    const auto devices = parallel::parse_device_list(f.devices, "--devices");
    f.world = static_cast<int>(devices.size());
    if (f.is_worker() && (f.worker_rank >= f.world || f.store.empty()))
      throw InvalidArgument("parallel worker: rank " + std::to_string(f.worker_rank) +
                            " or store missing (these flags are set by the launcher)");
    if (f.is_worker())
      f.rank_device = device::device_name(devices[static_cast<size_t>(f.worker_rank)]);
    return;
  }
  // A rank of a group started elsewhere: flags first, then torchrun's environment.
  const int rank = f.rank >= 0 ? f.rank : env_int("RANK", -1);
  const int world = f.world_size > 0 ? f.world_size : env_int("WORLD_SIZE", 0);
  const int local = f.local_rank >= 0 ? f.local_rank : env_int("LOCAL_RANK", 0);
  if (rank < 0 || world < 1)
    throw InvalidArgument(
        "--parallel " + f.mode +
        ": give --devices D0,D1,... for ranks on this machine, or start each rank with its "
        "place (torchrun sets RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT; or --rank, "
        "--world-size, --master-addr, --master-port)");
  if (rank >= world)
    throw InvalidArgument("rank " + std::to_string(rank) + " is outside a group of " +
                          std::to_string(world) +
                          " (RANK/--rank must be < WORLD_SIZE/--world-size)");
  f.world = world;
  if (world == 1) return;  // a group of one: an ordinary run
  if (f.master_addr.empty()) f.master_addr = env_string("MASTER_ADDR");
  if (f.master_port == 0) f.master_port = env_int("MASTER_PORT", 0);
  if (f.master_addr.empty() || f.master_port < 1 || f.master_port > 65535)
    throw InvalidArgument("rank " + std::to_string(rank) + " of " + std::to_string(world) +
                          ": where the ranks meet is missing (MASTER_ADDR and MASTER_PORT, "
                          "or --master-addr and --master-port 1..65535)");
  auto device = device::resolve_device(device_flag);
  // torchrun starts one process per accelerator: "cuda" means this host's LOCAL_RANK'th.
  if (!device.is_cpu() && device_flag.find(':') == std::string::npos)
    device = torch::Device(device.type(), static_cast<c10::DeviceIndex>(local));
  parallel::backend_for(device);  // refused before the load when this build cannot exchange
  f.worker_rank = rank;
  f.rank_device = device::device_name(device);
}

void check_sd_parallel_run(const ParallelFlags& f, const GenerationConfig& config) {
  if (parallel_mode(f) != ParallelMode::kCfg)
    throw InvalidArgument("--parallel " + f.mode +
                          ": splits the image tokens of a DiT's attention (HiDream); a Stable "
                          "Diffusion UNet runs --parallel cfg");
  if (f.world > 1)
    parallel::check_cfg_parallel_run(static_cast<size_t>(f.world), kSdBranches,
                                     config.guidance_scale,
                                     f.devices.empty() ? "--parallel cfg" : "--devices");
}

int run_parallel_launcher(const ParallelFlags& f, bool seed_given) {
  parallel::CfgLaunch launch;
  launch.devices = parallel::parse_device_list(f.devices, "--devices");
  launch.command = parallel::own_command_line();
  if (!seed_given) {
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

namespace {

parallel::GroupOptions group_options(const ParallelFlags& f, const std::string& purpose,
                                     const std::string& job) {
  parallel::GroupOptions o;
  o.rank = f.worker_rank;
  o.world = f.world;
  o.device = device::resolve_device(f.rank_device);
  o.store_file = f.store;
  o.master_addr = f.master_addr;
  o.master_port = f.master_port;
  o.job = job;
  o.purpose = purpose;
  o.timeout = to_ms(f.timeout_s);
  o.startup_timeout = to_ms(f.join_timeout_s);
  return o;
}

}  // namespace

std::shared_ptr<parallel::RankGroup> join_group(const ParallelFlags& f, const std::string& purpose,
                                                const std::string& job) {
  return parallel::connect_group(group_options(f, purpose, job));
}

parallel::ParallelGroups join_groups(const ParallelFlags& f, ParallelMode mode,
                                     const std::string& job) {
  switch (mode) {
    case ParallelMode::kCfg:
      return parallel::connect_groups(group_options(f, "CFG-parallel", job), f.world);
    case ParallelMode::kUlysses:
      return parallel::connect_groups(group_options(f, "Ulysses", job), 1);
    case ParallelMode::kCfgUlysses:
      break;
  }
  return parallel::connect_groups(group_options(f, "CFG-parallel + Ulysses", job), 2);
}

void require_shared_seed(const ParallelFlags& f, bool seed_given) {
  if (f.is_worker() && f.store.empty() && !seed_given)
    throw InvalidArgument(
        "--seed: ranks started separately must all be given the same seed (each would draw "
        "its own noise)");
}

std::string parallel_job_lines(const ParallelFlags& f, const std::string& model, uint64_t seed,
                               const std::vector<std::pair<std::string, std::string>>& fields) {
  std::string job = "model=" + model + "\nseed=" + std::to_string(seed) +
                    "\nparallel=" + (f.mode.empty() ? "cfg" : f.mode) + "\n";
  for (const auto& [key, value] : fields) job += key + "=" + value + "\n";
  return job;
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

int run_parallel_command(ParallelFlags& f, const std::string& device_flag, bool& quiet, bool& json,
                         const std::function<int()>& run) {
  resolve_parallel_flags(f, device_flag);
  if (!f.is_worker()) return run();
  if (f.worker_rank > 0) quiet = true, json = false;
  try {
    return run();
  } catch (const std::exception& e) {
    throw Error("rank " + std::to_string(f.worker_rank) + ": " + e.what());
  }
}

}  // namespace diffuse::app
