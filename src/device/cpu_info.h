// What the host CPU and its math libraries offer: model, SIMD/matrix features that make bf16
// fast, and which BLAS library libtorch's unblocked matmuls end up in.
#pragma once
#include <string>
#include <vector>

namespace diffuse::device {

struct CpuInfo {
  std::string model;  // /proc/cpuinfo "model name"
  int logical_cpus = 0;
  bool avx2 = false, avx512f = false, avx512_bf16 = false, avx512_vnni = false;
  bool amx_tile = false, amx_bf16 = false;
  std::string isa_cap = "native";  // $DIFFUSE_CPU_ISA: the flags above are already capped
};
const CpuInfo& cpu_info();

struct BlasInfo {
  std::string provider;             // file that defines sgemm_ (dladdr), symlinks resolved
  std::vector<std::string> loaded;  // BLAS/LAPACK-like libraries mapped into this process
  bool reference = false;           // the slow netlib reference BLAS
  // How OpenBLAS runs its threads (openblas_get_parallel): "pthreads" (its own pool, beside
  // LibTorch's OpenMP one), "openmp", "sequential"; "" when the BLAS is not OpenBLAS.
  std::string threading;
};
// BlasInfo::threading alone: one call into OpenBLAS, cheap enough for start-up decisions
// (blas_info() also scans /proc/self/maps).
std::string blas_threading();

// Which BLAS this process uses. Debian's libtorch calls whatever libblas.so.3 the
// alternatives system selects; the reference implementation is ~20x slower than OpenBLAS.
BlasInfo blas_info();

}  // namespace diffuse::device
