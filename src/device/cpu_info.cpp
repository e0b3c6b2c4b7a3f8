#include "device/cpu_info.h"

#include <dlfcn.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

#include "nn/kernels/cpu_features.h"

// OpenBLAS's own query; weak, so a build with another BLAS links and reports "".
extern "C" int openblas_get_parallel() __attribute__((weak));

namespace diffuse::device {
namespace {

bool has_flag(const std::string& flags, const char* flag) {
  std::istringstream in(flags);
  std::string f;
  while (in >> f)
    if (f == flag) return true;
  return false;
}

std::string canonical(const std::string& path) {
  std::error_code ec;
  auto p = std::filesystem::canonical(path, ec);
  return ec ? path : p.string();
}

bool looks_like_blas(const std::string& path) {
  std::string name = std::filesystem::path(path).filename().string();
  for (const char* key : {"blas", "lapack", "mkl_", "libmkl", "blis", "atlas"})
    if (name.find(key) != std::string::npos) return true;
  return false;
}

}  // namespace

const CpuInfo& cpu_info() {
  static const CpuInfo info = [] {
    CpuInfo c;
    c.logical_cpus = static_cast<int>(std::thread::hardware_concurrency());
    std::ifstream in("/proc/cpuinfo");
    std::string line;
    bool have_flags = false;
    while (std::getline(in, line)) {
      auto colon = line.find(':');
      if (colon == std::string::npos) continue;
      std::string value = colon + 2 <= line.size() ? line.substr(colon + 2) : "";
      if (c.model.empty() && line.rfind("model name", 0) == 0) c.model = value;
      if (!have_flags && line.rfind("flags", 0) == 0) {
        have_flags = true;
        c.avx2 = has_flag(value, "avx2");
        c.avx512f = has_flag(value, "avx512f");
        c.avx512_bf16 = has_flag(value, "avx512_bf16");
        c.avx512_vnni = has_flag(value, "avx512_vnni");
        c.amx_tile = has_flag(value, "amx_tile");
        c.amx_bf16 = has_flag(value, "amx_bf16");
      }
    }
    // The same cap as the kernels' (DIFFUSE_CPU_ISA), so the dtype policy and doctor agree
    // with the kernels that run.
    const nn::kernels::IsaCap cap = nn::kernels::isa_cap();
    c.isa_cap = nn::kernels::isa_cap_name(cap);
    if (cap != nn::kernels::IsaCap::native) c.avx512_bf16 = c.amx_bf16 = c.amx_tile = false;
    if (cap == nn::kernels::IsaCap::avx2 || cap == nn::kernels::IsaCap::baseline)
      c.avx512f = c.avx512_vnni = false;
    if (cap == nn::kernels::IsaCap::baseline) c.avx2 = false;
    return c;
  }();
  return info;
}

std::string blas_threading() {
  if (!openblas_get_parallel) return "";
  const int mode = openblas_get_parallel();
  return mode == 1 ? "pthreads" : mode == 2 ? "openmp" : "sequential";
}

BlasInfo blas_info() {
  BlasInfo b;
  b.threading = blas_threading();
  if (void* sym = dlsym(RTLD_DEFAULT, "sgemm_")) {
    Dl_info info;
    if (dladdr(sym, &info) && info.dli_fname) b.provider = canonical(info.dli_fname);
  }
  std::set<std::string> seen;
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    auto slash = line.find('/');
    if (slash == std::string::npos) continue;
    std::string path = line.substr(slash);
    if (looks_like_blas(path) && seen.insert(path).second) b.loaded.push_back(path);
  }
  // Debian's reference BLAS lives in .../blas/libblas.so.3; OpenBLAS, BLIS, MKL and ATLAS
  // install theirs under their own names or folders.
  const std::string& p = b.provider;
  b.reference = p.find("/blas/libblas") != std::string::npos ||
                (p.find("libblas") != std::string::npos &&
                 p.find("openblas") == std::string::npos && p.find("blis") == std::string::npos &&
                 p.find("atlas") == std::string::npos && p.find("mkl") == std::string::npos);
  return b;
}

}  // namespace diffuse::device
