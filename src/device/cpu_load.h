// Measures how much of the CPUs went to other work while the engine ran (diffuse/cpu_share.h):
// from /proc/stat (every process, and the hypervisor's steal) less this process's own time.
// When others hold the cores, each parallel operator waits until all of its threads got a time
// slice, and a model of small operators runs many times slower (the demo model, 2 threads
// beside two busy loops: 27-47x).
#pragma once
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "diffuse/cpu_share.h"

namespace diffuse::device {

using diffuse::CpuShare;

// Cumulative CPU times at one moment, in seconds.
struct CpuTimes {
  double wall_s = 0;   // steady clock
  double busy_s = 0;   // all CPUs, every process: user + nice + system + irq + softirq
  double steal_s = 0;  // all CPUs: time the hypervisor ran something else on them
  double self_s = 0;   // this process (user + system, all threads)
  int cpus = 0;        // CPUs this process may run on
};

// /proc/stat's "cpu" lines ("cpuN user nice system idle iowait irq softirq steal ...", in ticks
// of `ticks_per_s`) as busy and steal seconds: the sum over the CPUs listed in `only` (a process
// pinned to some of the machine's CPUs), or the all-CPU line when `only` is empty. nullopt when
// a line is missing or malformed.
std::optional<CpuTimes> parse_proc_stat(const std::string& text, double ticks_per_s,
                                        const std::vector<int>& only = {});

// The times now; nullopt where /proc/stat cannot be read (not Linux).
std::optional<CpuTimes> sample_cpu_times();

// What the interval between two samples had.
CpuShare cpu_share_between(const CpuTimes& from, const CpuTimes& to, int threads);

// {"threads", "cpus", "other_processes", "hypervisor", "crowded"} (CLI --json, server results,
// doctor); the loads are in CPUs and null where unknown.
nlohmann::json cpu_share_json(const CpuShare& share);

// "other processes used 1.9 of 2 CPUs, the hypervisor 0.1", for notes and bench lines.
std::string describe_cpu_share(const CpuShare& s);

// Measures the interval from construction to share(): a generation's denoising loop.
class CpuShareMeter {
 public:
  explicit CpuShareMeter(int threads);
  CpuShare share() const;  // unknown fields stay -1

 private:
  int threads_;
  std::optional<CpuTimes> start_;
};

}  // namespace diffuse::device
