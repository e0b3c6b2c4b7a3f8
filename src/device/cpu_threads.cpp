#include "device/cpu_threads.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>

#if defined(__linux__)
#include <sched.h>
#endif

#include "device/cpu_reproducibility.h"
#include "diffuse/errors.h"

// OpenBLAS (Debian's libtorch calls whatever libblas.so.3 is selected) runs its own thread
// pool sized to the machine, ignoring at::set_num_threads; float32 linear layers and math
// attention go through it. Weak, so builds against other BLAS libraries link too.
extern "C" void openblas_set_num_threads(int) __attribute__((weak));

namespace diffuse::device {
namespace {

void set_threads(int n) {
  at::set_num_threads(n);
  if (openblas_set_num_threads) openblas_set_num_threads(n);
}

bool& user_chose_threads() {
  static bool chose = false;
  return chose;
}

}  // namespace

int available_cpus() {
#if defined(__linux__)
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) {
    int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
#endif
  unsigned n = std::thread::hardware_concurrency();
  return n > 0 ? static_cast<int>(n) : 1;
}

int configure_cpu_threads() {
  static std::once_flag once;
  static int configured = 0;
  std::call_once(once, [] {
    request_reproducible_blas();  // before BLAS runs, or LibTorch sets MKL's threads
    // oneDNN marks every primitive for Intel's tracing tools (ITT) unless told not to: 5 % of a
    // training step's time went to those markers. Before oneDNN first runs; the user's wins.
    setenv("DNNL_ITT_TASK_LEVEL", "0", /*overwrite=*/0);
    const char* mine = std::getenv("DIFFUSE_THREADS");
    const char* omp = std::getenv("OMP_NUM_THREADS");
    const char* mkl = std::getenv("MKL_NUM_THREADS");
    if (mine && *mine) {
      char* end = nullptr;
      long n = std::strtol(mine, &end, 10);
      if (*end != '\0' || n < 1 || n > 4096)
        throw InvalidArgument(std::string("DIFFUSE_THREADS must be a positive integer, got '") +
                              mine + "'");
      set_threads(static_cast<int>(n));
      user_chose_threads() = true;
    } else if ((omp && *omp) || (mkl && *mkl)) {
      user_chose_threads() = true;  // the user's setting, applied by LibTorch
    } else {
      set_threads(available_cpus());
    }
    configured = at::get_num_threads();
  });
  // The count chosen here, not at::get_num_threads(): a generation may run with fewer for a
  // while (ScopedCpuThreads) on this thread.
  return configured;
}

bool cpu_threads_chosen_by_user() {
  configure_cpu_threads();
  return user_chose_threads();
}

int threads_for_step_work(double step_flops, int current, bool chosen_by_user) {
  if (chosen_by_user || !(step_flops < kSmallStepFlops)) return std::max(current, 1);
  return 1;
}

int threads_for_step_work(double step_flops) {
  configure_cpu_threads();
  // What is in effect, which a library user may have set after the engine configured it.
  return threads_for_step_work(step_flops, at::get_num_threads(), cpu_threads_chosen_by_user());
}

ScopedCpuThreads::ScopedCpuThreads(int threads) : previous_(at::get_num_threads()) {
  if (threads >= 1 && threads != previous_) set_threads(threads);
}

ScopedCpuThreads::~ScopedCpuThreads() {
  if (at::get_num_threads() != previous_) set_threads(previous_);
}

}  // namespace diffuse::device
