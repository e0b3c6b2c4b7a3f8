// How much of the CPUs a stretch of the engine's work had (a generation's denoising loop):
// when other processes or the hypervisor hold the cores, the engine's intra-op threads wait
// for each other at every parallel operator, so a slow run can say why.
#pragma once

namespace diffuse {

// In CPUs: seconds of CPU time per second of the interval, averaged over it.
struct CpuShare {
  int threads = 0;     // intra-op threads the engine ran with
  int cpus = 0;        // CPUs the process may use
  double others = -1;  // other processes' busy time; -1 unknown (no /proc/stat)
  double steal = -1;   // taken by the hypervisor; -1 unknown
  double self = -1;    // this process; -1 unknown
  // The CPUs left to the engine: cpus - others - steal, at least 0 (cpus when unknown).
  double free() const;
  // True when the engine ran more threads than the CPUs left to it, by half a CPU or more:
  // then its threads wait for each other at every operator.
  bool crowded() const;
};

}  // namespace diffuse
