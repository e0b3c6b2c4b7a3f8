#include "parallel/cfg_launch.h"

#include <stdlib.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <set>

#include "device/cpu_threads.h"
#include "device/device.h"
#include "diffuse/errors.h"
#include "parallel/branch_split.h"
#include "parallel/process_group.h"
#include "parallel/worker_processes.h"

namespace fs = std::filesystem;

namespace diffuse::parallel {
namespace {

bool env_set(const char* name) {
  const char* v = std::getenv(name);
  return v && *v;
}

}  // namespace

std::vector<torch::Device> parse_device_list(const std::string& list, const std::string& flag) {
  std::vector<std::string> names;
  size_t start = 0;
  for (;;) {
    const size_t comma = list.find(',', start);
    names.push_back(list.substr(start, comma == std::string::npos ? comma : comma - start));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  for (size_t i = 0; i < names.size(); ++i)
    if (names[i].empty() || names[i].find_first_of(" \t") != std::string::npos)
      throw InvalidArgument(flag + " '" + list + "': entry " + std::to_string(i + 1) +
                            " is empty or has spaces (expected a comma-separated list such as "
                            "cpu,cpu or cuda:0,cuda:1)");
  if (names.size() < 2)
    throw InvalidArgument(flag + " '" + list +
                          "': CFG-parallel needs at least two devices, one per process "
                          "(e.g. cpu,cpu or cuda:0,cuda:1); for one device use --device");
  std::vector<torch::Device> devices;
  std::set<std::string> seen;
  for (const auto& n : names) {
    if (n == "auto")
      throw InvalidArgument(flag + " '" + list +
                            "': name each device (cpu, cuda:N or npu:N), not auto");
    devices.push_back(device::resolve_device(n));
    const std::string canonical = device::device_name(devices.back());
    if (devices.back().type() != devices.front().type())
      throw InvalidArgument(flag + " '" + list + "': all devices must be of one type (got " +
                            device::device_name(devices.front()) + " and " + canonical +
                            "), as one collective backend connects them");
    if (!devices.back().is_cpu() && !seen.insert(canonical).second)
      throw InvalidArgument(flag + " '" + list + "': " + canonical +
                            " is listed twice (expected one process per accelerator)");
  }
  backend_for(devices.front());  // DeviceError when this build cannot connect them
  return devices;
}

void check_cfg_parallel_run(size_t devices, int branches, double guidance_scale,
                            const std::string& flag) {
  if (!(guidance_scale > 1.0))
    throw InvalidArgument(flag +
                          ": CFG-parallel splits classifier-free guidance, which is off "
                          "at guidance scale " +
                          std::to_string(guidance_scale) + " (expected --cfg-scale > 1)");
  if (devices > static_cast<size_t>(branches))
    throw InvalidArgument(flag + ": " + std::to_string(devices) + " devices for " +
                          std::to_string(branches) +
                          " guidance branches (expected at most one device per branch)");
  check_branch_split(branches, static_cast<int>(devices));
}

void launch_cfg_workers(const CfgLaunch& launch) {
  PrivateTempDir dir;
  const std::string store = dir.path() + "/store";
  int cpu_workers = 0;
  for (const auto& d : launch.devices) cpu_workers += d.is_cpu();
  std::vector<std::string> env;
  if (cpu_workers > 0 && !env_set("DIFFUSE_THREADS") && !env_set("OMP_NUM_THREADS"))
    env.push_back("DIFFUSE_THREADS=" +
                  std::to_string(std::max(1, device::available_cpus() / cpu_workers)));
  std::vector<WorkerSpec> workers;
  for (size_t r = 0; r < launch.devices.size(); ++r) {
    WorkerSpec w;
    w.label = "rank " + std::to_string(r) + " on " + device::device_name(launch.devices[r]);
    w.argv = launch.command;
    w.argv.insert(w.argv.end(), launch.extra_args.begin(), launch.extra_args.end());
    w.argv.insert(w.argv.end(), {kWorkerRankFlag, std::to_string(r), kStoreFlag, store});
    w.env = env;
    workers.push_back(std::move(w));
  }
  run_workers(workers, launch.grace);
}

}  // namespace diffuse::parallel
