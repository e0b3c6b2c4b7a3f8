// `--devices D0,D1` of txt2img / img2img (CFG-parallel, src/parallel): the launcher's checks
// and start, and what a worker (the same command with hidden flags) needs.
#pragma once
#include <torch/types.h>
#include <CLI/CLI.hpp>

#include <memory>
#include <string>
#include <vector>

#include "diffuse/pipeline.h"

namespace diffuse::parallel {
class CfgGroup;
}

namespace diffuse::app {

struct ParallelFlags {
  std::string devices;     // "cpu,cpu"; empty = one process
  double timeout_s = 120;  // each exchange between the ranks
  int worker_rank = -1;    // hidden: set in the workers the launcher starts
  std::string store;       // hidden: the workers' FileStore
  std::string hash_log;    // hidden, tests: each rank appends "STEP HASH" lines to PATH.rankR
  bool active() const { return !devices.empty(); }
  bool is_worker() const { return worker_rank >= 0; }
};

void add_parallel_flags(CLI::App& app, ParallelFlags& flags);
// Before anything loads: the device list, guidance on, a Stable Diffusion model (two
// branches). Returns the devices, rank order. InvalidArgument / DeviceError otherwise.
std::vector<torch::Device> check_parallel_flags(const ParallelFlags& flags,
                                                const GenerationConfig& config, bool hidream);
// The launcher: starts one worker per device running this same command line and waits for
// them (a seed is fixed here when none was given, so every rank draws the same noise).
int run_parallel_launcher(const std::vector<torch::Device>& devices,
                          const GenerationConfig& config);
// A worker, after loading: meets the other ranks.
std::shared_ptr<parallel::CfgGroup> join_cfg_group(const ParallelFlags& flags,
                                                   const std::vector<torch::Device>& devices);
// A worker's step callback: `inner`, plus the hidden hash log and the test-only fault
// injection ($DIFFUSE_TEST_CFG_FAULT="RANK:STEP:exit|hang": that rank exits with status 3, or
// blocks until killed, when step STEP (1-based) is done).
StepCallback worker_step_callback(const ParallelFlags& flags, StepCallback inner);
// Runs a worker's command, its errors prefixed with its rank and device.
int run_as_worker(const ParallelFlags& flags, const std::function<int()>& run);

}  // namespace diffuse::app
