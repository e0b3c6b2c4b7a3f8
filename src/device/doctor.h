// `diffuse doctor`: what this build and this machine can run. libtorch version and build
// options, BLAS in use, CPU features, threads, CUDA and Ascend (torch_npu / CANN) presence,
// and for each device: name, memory, dtypes that work (probed), the dtype the policy picks,
// attention backends, and a smoke test (a ResnetBlock2D + Transformer2DModel forward with
// random weights, compared with the CPU).
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "diffuse/cpu_share.h"

namespace diffuse::device {

struct DoctorOptions {
  std::string device;      // the device the caller wants to run on ("" = none requested)
  bool smoke_test = true;  // run the block forward on every device
};

struct DeviceCheck {
  std::string name;                 // "cpu", "cuda:0", "npu:0"
  std::string description;          // CPU model, GPU name, NPU SoC
  std::string backend;              // "cpu", "cuda", "torch_npu", "simulated"
  int64_t total_memory_bytes = 0;   // 0 = unknown
  std::vector<std::string> dtypes;  // dtypes whose probe passed: fp32, bf16, fp16
  bool bf16_fast = false;
  std::string unet_dtype, vae_dtype;   // what --dtype auto / --vae-dtype auto pick
  std::vector<std::string> attention;  // attention backends that run here
  // --weights types whose blocks dequantize here (checked against ggml's reference); linear
  // layers then run in unet_dtype (no int8/fp8 matmul kernels are used).
  std::vector<std::string> weight_types;
  bool smoke_ok = false;
  std::string smoke_dtype;
  double smoke_seconds = 0;
  double smoke_max_abs_diff = 0;  // against the CPU fp32 result
  std::string error;              // why the device or its smoke test failed
};

struct DoctorReport {
  std::string diffuse_version;
  std::string libtorch_version;
  std::string torch_config;  // at::show_config()
  bool cuda_compiled = false, mkldnn = false, openmp = false;
  std::string blas_provider;
  std::vector<std::string> blas_loaded;
  bool blas_reference = false;
  std::string blas_threading;  // BlasInfo::threading: pthreads|openmp|sequential, "" = not OpenBLAS
  bool blas_mkl = false;       // LibTorch was built with MKL (BLAS_INFO=mkl: PyTorch's x86 wheels)
  std::string mkl_cbwr;        // MKL's reproducibility mode in effect (env MKL_CBWR), "" = unset
  std::string cpu_model;
  int logical_cpus = 0;
  bool avx2 = false, avx512f = false, avx512_bf16 = false, amx_bf16 = false, amx_tile = false;
  std::string isa_cap = "native";  // DIFFUSE_CPU_ISA
  bool winograd_conv = false;      // float32 3x3 convolutions may take Winograd (DIFFUSE_WINOGRAD)
  int intra_op_threads = 0, inter_op_threads = 0;
  bool threads_chosen_by_user = false;  // DIFFUSE_THREADS / OMP_NUM_THREADS / MKL_NUM_THREADS
  int small_model_threads = 0;          // for a step under kSmallStepFlops (device/cpu_threads.h)
  // Other processes' and the hypervisor's CPU time during a short sample (0.3 s), against the
  // configured threads; loads -1 where unknown (no /proc/stat).
  CpuShare cpu_load_now;
  std::string omp_num_threads;  // env, "" = unset
  std::string omp_wait_policy;  // env OMP_WAIT_POLICY, "" = unset (the CLI sets PASSIVE beside a
                                // pthread OpenBLAS)
  std::string thp_mode;         // /sys/kernel/mm/transparent_hugepage/enabled: always|madvise|never
  bool malloc_huge_pages = false;  // GLIBC_TUNABLES has glibc.malloc.hugetlb (the CLI sets it)
  int64_t cuda_devices = 0;
  bool torch_npu_linked = false;  // built with -DDIFFUSE_WITH_TORCH_NPU=ON
  std::string npu_backend;        // "" = none, "torch_npu", "simulated"
  int64_t npu_devices = 0;
  std::string ascend_toolkit_home, ascend_home_path;  // env
  bool usr_local_ascend = false;                      // /usr/local/Ascend exists
  std::string cann_version;                           // from the toolkit's version.cfg
  std::string cpu_fallback;                           // "diffuse", "torch_npu/other", "none"
  std::vector<DeviceCheck> devices;
  std::string requested_device;
  bool requested_ok = true;
  std::string requested_error;
  std::vector<std::string> warnings;
  std::vector<std::string> notes;
};

DoctorReport run_doctor(const DoctorOptions& options);
nlohmann::json to_json(const DoctorReport& report);
std::string to_text(const DoctorReport& report);

}  // namespace diffuse::device
