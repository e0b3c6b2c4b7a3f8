// `--devices D0,D1,...` from the launcher's side: checks the device list before anything
// loads, then runs one worker process per device (this same program, with the hidden worker
// flags below) that meet through a FileStore in a private temporary folder.
#pragma once
#include <torch/types.h>

#include <chrono>
#include <string>
#include <vector>

namespace diffuse::parallel {

// The hidden flags a worker receives: its rank and the store file.
inline constexpr const char* kWorkerRankFlag = "--cfg-worker";
inline constexpr const char* kStoreFlag = "--cfg-store";

// Parses "cpu,cpu", "cuda:0,cuda:1", "npu:0,npu:1": at least two entries, none empty, each a
// device present here (device::resolve_device), all of one type, no accelerator twice (one
// process per accelerator), and a collective backend for that type in this build. `flag`
// names the option in messages. InvalidArgument / DeviceError otherwise.
std::vector<torch::Device> parse_device_list(const std::string& list, const std::string& flag);

// What a CFG-parallel run needs from the generation: guidance on (scale > 1) and at most one
// device per guidance branch. InvalidArgument naming `flag` otherwise.
void check_cfg_parallel_run(size_t devices, int branches, double guidance_scale,
                            const std::string& flag);

struct CfgLaunch {
  std::vector<torch::Device> devices;   // rank r runs on devices[r]
  std::vector<std::string> command;     // the command line each worker repeats (argv[0] first)
  std::vector<std::string> extra_args;  // appended before the worker flags (e.g. --seed N)
  // After a worker fails, how long the others get to exit on SIGTERM before SIGKILL.
  std::chrono::milliseconds grace{std::chrono::seconds(10)};
};

// Runs the workers and waits for them (see run_workers). CPU workers share the machine's
// cores: unless DIFFUSE_THREADS or OMP_NUM_THREADS is set, each gets cores / cpu workers
// intra-op threads. Throws diffuse::Error when any worker fails.
void launch_cfg_workers(const CfgLaunch& launch);

}  // namespace diffuse::parallel
