// Intra-op thread count for CPU work. LibTorch's default comes from cpuinfo's core count,
// which reports 1 in some VMs (this 2-CPU machine among them) and leaves cores idle; the
// engine instead uses every CPU the process may run on, unless told otherwise.
#pragma once

namespace diffuse::device {

// Sets the intra-op thread count (LibTorch's and OpenBLAS's) once per process, and asks MKL for
// reproducible results (device/cpu_reproducibility.h) first:
// $DIFFUSE_THREADS if set, else LibTorch's choice when $OMP_NUM_THREADS or $MKL_NUM_THREADS is
// set, else the number of CPUs in this process's affinity mask. Returns the count it chose
// (a generation of a small model runs on fewer: threads_for_step_work).
// InvalidArgument for a malformed DIFFUSE_THREADS.
int configure_cpu_threads();

// CPUs this process may run on (sched_getaffinity), at least 1.
int available_cpus();

// Whether the user chose the thread count ($DIFFUSE_THREADS, $OMP_NUM_THREADS or
// $MKL_NUM_THREADS set when configure_cpu_threads() ran).
bool cpu_threads_chosen_by_user();

// Below this much work per denoising step (a 128x128 image of the demo model: 0.4 GFLOP), the
// operators are so small that a second thread gains nothing on an idle machine, and when other
// work holds the cores every operator waits for all of its threads to get a time slice: 2
// threads beside two busy loops ran the demo model's step 27-47x slower than 1 thread. At 1.8
// GFLOP (the demo model at 256x256) 2 threads are 20 % faster idle and as fast under load.
constexpr double kSmallStepFlops = 1e9;

// The intra-op threads for a generation whose every step does about `step_flops`: 1 for a step
// under kSmallStepFlops unless the user chose a count, else `current`.
int threads_for_step_work(double step_flops, int current, bool chosen_by_user);
// The same for this process and the calling thread (at::get_num_threads() as current).
int threads_for_step_work(double step_flops);

// Runs the calling thread's LibTorch operators (its OpenMP team size is per thread) and
// OpenBLAS (process-wide) on `threads` threads until destroyed, then restores the count before.
class ScopedCpuThreads {
 public:
  explicit ScopedCpuThreads(int threads);
  ~ScopedCpuThreads();
  ScopedCpuThreads(const ScopedCpuThreads&) = delete;
  ScopedCpuThreads& operator=(const ScopedCpuThreads&) = delete;

 private:
  int previous_;
};

}  // namespace diffuse::device
