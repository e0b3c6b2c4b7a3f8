// The parallel runs of txt2img / img2img / edit (src/parallel): `--devices D0,D1,...` starts
// one local worker per device (this same command with hidden flags); `--parallel MODE` without
// --devices makes this process one rank of a group started elsewhere, by the torchrun
// convention (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT, or the flags of the same
// names): torchrun, Slurm, Kubernetes, or one command per host. Rank 0 decodes and writes.
#pragma once
#include <torch/types.h>
#include <CLI/CLI.hpp>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "diffuse/pipeline.h"

#include "parallel/process_group.h"

namespace diffuse::app {

// How the ranks share the work: the guidance branches (cfg), the image tokens of each
// attention (ulysses: HiDream), or both (cfg,ulysses: HiDream on 2 x N ranks).
enum class ParallelMode { kCfg, kUlysses, kCfgUlysses };

struct ParallelFlags {
  std::string devices;          // "cpu,cpu"; empty = one process (or a torchrun rank)
  std::string mode;             // --parallel; empty: cfg
  double timeout_s = 120;       // each exchange between the ranks
  double join_timeout_s = 600;  // the ranks meeting after loading
  // The torchrun convention; unset flags come from the environment.
  int rank = -1, world_size = 0, local_rank = -1, master_port = 0;
  std::string master_addr;
  int worker_rank = -1;  // hidden: set in the workers the launcher starts (or from RANK)
  std::string store;     // hidden: the workers' FileStore
  std::string hash_log;  // hidden, tests: each rank appends "STEP HASH" lines to PATH.rankR
  // Resolved by resolve_parallel_flags: the group's size and this rank's device.
  int world = 0;
  std::string rank_device;

  bool active() const { return !devices.empty() || !mode.empty(); }
  bool is_worker() const { return worker_rank >= 0; }
  bool is_launcher() const { return !devices.empty() && worker_rank < 0; }
};

void add_parallel_flags(CLI::App& app, ParallelFlags& flags);
ParallelMode parallel_mode(const ParallelFlags& flags);

// Before anything loads, in the launcher and every rank: the mode, the device list (a local
// group) or this rank's place from the torchrun flags/environment (a group started elsewhere);
// fills world, worker_rank and rank_device. `device_flag` is --device (a torchrun rank on an
// accelerator takes index LOCAL_RANK when it names none). A torchrun "group" of one is no
// group: active() stays, world is 1. InvalidArgument / DeviceError naming the flag or variable.
void resolve_parallel_flags(ParallelFlags& flags, const std::string& device_flag);

// Stable Diffusion: guidance on, no more ranks than its two branches, cfg mode only.
void check_sd_parallel_run(const ParallelFlags& flags, const GenerationConfig& config);
// The launcher: starts one worker per device running this same command line and waits for
// them. `seed_given`: else a seed is fixed here, so every rank draws the same noise.
int run_parallel_launcher(const ParallelFlags& flags, bool seed_given);
// A rank, after loading: meets the others. `job`: what all ranks must agree on, one
// "key=value" per line (model, seed, size, ...).
std::shared_ptr<parallel::RankGroup> join_group(const ParallelFlags& flags,
                                                const std::string& purpose, const std::string& job);
// InvalidArgument unless a rank started elsewhere (torchrun) was given --seed: each would draw
// its own noise. (The local launcher fixes one for its workers.)
void require_shared_seed(const ParallelFlags& flags, bool seed_given);
// The `job` of join_group: "model=...", "seed=...", "parallel=MODE", then `fields` as
// "key=value" lines.
std::string parallel_job_lines(const ParallelFlags& flags, const std::string& model, uint64_t seed,
                               const std::vector<std::pair<std::string, std::string>>& fields);
// A DiT rank, after loading: meets the others and splits the world for `mode` (cfg: every rank
// a branch share; ulysses: every rank a token share; cfg,ulysses: two branch shares of N token
// shares each).
parallel::ParallelGroups join_groups(const ParallelFlags& flags, ParallelMode mode,
                                     const std::string& job);
// A worker's step callback: `inner`, plus the hidden hash log and the test-only fault
// injection ($DIFFUSE_TEST_CFG_FAULT="RANK:STEP:exit|hang": that rank exits with status 3, or
// blocks until killed, when step STEP (1-based) is done). `latents` of the step, if any.
StepCallback worker_step_callback(const ParallelFlags& flags, StepCallback inner);
// A command as this process's part of a parallel run: resolves `flags` (--device is
// `device_flag`), quiets ranks other than 0 (`quiet`, `json`), prefixes a rank's errors with its
// rank; an ordinary run when no parallel flag was given.
int run_parallel_command(ParallelFlags& flags, const std::string& device_flag, bool& quiet,
                         bool& json, const std::function<int()>& run);

}  // namespace diffuse::app
