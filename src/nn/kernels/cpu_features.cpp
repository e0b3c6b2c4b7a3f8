#include "nn/kernels/cpu_features.h"

#include <cctype>
#include <cstdlib>
#include <string>

#include "diffuse/errors.h"

namespace diffuse::nn::kernels {
namespace {

// oneDNN's own cap (ONEDNN_MAX_CPU_ISA, or its older name DNNL_MAX_CPU_ISA): set to an ISA
// without AMX, its bf16 products run on AVX512-BF16, and the choices that weigh AMX's speed
// (int8_linear_chosen, int8_conv2d_chosen) must know.
bool onednn_may_use_amx() {
  for (const char* name : {"ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA"}) {
    const char* v = std::getenv(name);
    if (!v || !*v) continue;
    std::string isa(v);
    for (auto& c : isa) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    return isa == "ALL" || isa.find("AMX") != std::string::npos;
  }
  return true;
}

}  // namespace

IsaCap isa_cap() {
  static const IsaCap cap = [] {
    const char* env = std::getenv("DIFFUSE_CPU_ISA");
    const std::string v = env ? env : "";
    if (v.empty() || v == "native") return IsaCap::native;
    if (v == "avx512") return IsaCap::avx512;
    if (v == "avx2") return IsaCap::avx2;
    if (v == "baseline") return IsaCap::baseline;
    throw InvalidArgument("DIFFUSE_CPU_ISA='" + v +
                          "' is not a CPU level (expected native, avx512, avx2 or baseline)");
  }();
  return cap;
}

const char* isa_cap_name(IsaCap cap) {
  switch (cap) {
    case IsaCap::avx512:
      return "avx512";
    case IsaCap::avx2:
      return "avx2";
    case IsaCap::baseline:
      return "baseline";
    default:
      return "native";
  }
}

const CpuFeatures& cpu_features() {
  static const CpuFeatures f = [] {
    CpuFeatures out;
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    out.avx2_fma = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    out.avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                 __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 10
    out.avx512_bf16 = out.avx512 && __builtin_cpu_supports("avx512bf16");
#endif
    out.avx512_vnni = out.avx512 && __builtin_cpu_supports("avx512vnni");
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12
    out.amx_bf16 = out.avx512_bf16 && __builtin_cpu_supports("amx-bf16") && onednn_may_use_amx();
#endif
#endif
    const IsaCap cap = isa_cap();
    if (cap != IsaCap::native) out.avx512_bf16 = out.avx512_vnni = out.amx_bf16 = false;
    if (cap == IsaCap::avx2 || cap == IsaCap::baseline) out.avx512 = false;
    if (cap == IsaCap::baseline) out.avx2_fma = false;
    return out;
  }();
  return f;
}

const std::vector<const CpuKernels*>& runnable_cpu_kernels() {
  static const std::vector<const CpuKernels*> list = [] {
    std::vector<const CpuKernels*> out;
    if (cpu_features().avx512 && avx512_cpu_kernels()) out.push_back(avx512_cpu_kernels());
    if (cpu_features().avx2_fma && avx2_cpu_kernels()) out.push_back(avx2_cpu_kernels());
    out.push_back(portable_cpu_kernels());
    return out;
  }();
  return list;
}

const CpuKernels& cpu_kernels() {
  static const CpuKernels* chosen = [] {
    const char* env = std::getenv("DIFFUSE_CPU_KERNELS");
    if (!env || !*env) return runnable_cpu_kernels().front();
    std::string list;
    for (const auto* k : runnable_cpu_kernels()) {
      if (std::string(env) == k->name) return k;
      list += (list.empty() ? "" : ", ") + std::string(k->name);
    }
    throw InvalidArgument(std::string("DIFFUSE_CPU_KERNELS='") + env +
                          "' is not runnable here (available: " + list + ")");
  }();
  return *chosen;
}

}  // namespace diffuse::nn::kernels
