// Intra-op thread count for CPU work. LibTorch's default comes from cpuinfo's core count,
// which reports 1 in some VMs (this 2-CPU machine among them) and leaves cores idle; the
// engine instead uses every CPU the process may run on, unless told otherwise.
#pragma once

namespace diffuse::device {

// Sets the intra-op thread count (LibTorch's and OpenBLAS's) once per process, and asks MKL for
// reproducible results (device/cpu_reproducibility.h) first:
// $DIFFUSE_THREADS if set, else LibTorch's choice when $OMP_NUM_THREADS or $MKL_NUM_THREADS is
// set, else the number of CPUs in this process's affinity mask. Returns the thread count in effect.
// InvalidArgument for a malformed DIFFUSE_THREADS.
int configure_cpu_threads();

// CPUs this process may run on (sched_getaffinity), at least 1.
int available_cpus();

}  // namespace diffuse::device
