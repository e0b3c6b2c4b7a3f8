#include "device/doctor.h"

#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <sstream>
#include <thread>

#include "device/cpu_allocator.h"
#include "device/cpu_fallback.h"
#include "device/cpu_info.h"
#include "device/cpu_load.h"
#include "device/cpu_threads.h"
#include "device/cuda_backend.h"
#include "device/device.h"
#include "device/npu_backend.h"
#include "nn/attention_npu.h"
#include "nn/winograd_conv.h"
#if __has_include("nn/attention/backends.h")
#define DIFFUSE_DOCTOR_ATTENTION_TABLE 1  // the attention module lists what runs per device
#endif
#include "nn/int8_linear.h"
#include "nn/random_init.h"
#include "nn/resnet.h"
#include "nn/transformer_2d.h"
#include "quant/quantized_weight.h"

namespace diffuse::device {
namespace {

// The --weights types whose blocks dequantize on `d` to what the CPU gives (ggml's reference for
// its types); int8 says where it multiplies in 8-bit integers instead.
std::vector<std::string> quantized_weight_types(const torch::Device& d) {
  std::vector<std::string> ok;
  for (auto type : {quant::GgmlType::Q8_0, quant::GgmlType::Q4_0, quant::GgmlType::I8_ROWS}) {
    try {
      torch::NoGradGuard no_grad;
      const auto w = torch::linspace(-1, 1, 8 * 64).view({8, 64});
      auto q = quant::quantize_weight(w, type, "probe");
      const auto on_cpu = quant::dequantize_weight(q, torch::kFloat32);
      q.blocks = q.blocks.to(d);
      if (q.row_scales.defined()) q.row_scales = q.row_scales.to(d);
      if (!torch::equal(quant::dequantize_weight(q, torch::kFloat32).to(torch::kCPU), on_cpu))
        continue;
      const bool integer =
          type == quant::GgmlType::I8_ROWS && d.is_cpu() && nn::int8_gemm_available();
      ok.push_back(std::string(quant::ggml_type_traits(type).name) +
                   (integer ? " (8-bit integer products: AVX512-VNNI)" : ""));
    } catch (const std::exception&) {
      // not on this device
    }
  }
  return ok;
}

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

int64_t host_memory_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  int64_t kb = 0;
  while (in >> key >> kb) {
    if (key == "MemTotal:") return kb * 1024;
    in.ignore(256, '\n');
  }
  return 0;
}

// "version=8.0.RC1" style line of the CANN toolkit's version.cfg / version.info.
std::string cann_version(const std::string& home) {
  for (const char* rel :
       {"version.cfg", "version.info", "compiler/version.info", "runtime/version.info"}) {
    std::ifstream in(std::filesystem::path(home) / rel);
    std::string line;
    while (std::getline(in, line)) {
      auto eq = line.find('=');
      if (eq == std::string::npos) continue;
      std::string key = line.substr(0, eq);
      if (key.find("version") != std::string::npos || key.find("Version") != std::string::npos)
        return line.substr(eq + 1);
    }
  }
  return "";
}

std::string backend_of(const torch::Device& d) {
  if (d.is_cpu()) return "cpu";
  if (d.is_cuda()) return "cuda";
  const NpuBackend* b = npu_backend();
  return b ? b->name : "npu";
}

// A UNet-like block with seeded random weights: the ops a real model needs (group/layer
// norm, conv, linear, SiLU, GELU, attention, residuals), small enough to run in milliseconds.
torch::Tensor smoke_forward(const torch::Device& device, torch::Dtype dtype) {
  torch::NoGradGuard no_grad;
  nn::ResnetBlock2DOptions ro;
  ro.in_channels = 32;
  ro.out_channels = 32;
  ro.temb_channels = 64;
  ro.groups = 8;
  nn::ResnetBlock2D resnet(ro);
  nn::init_random_weights(*resnet, 7);
  nn::Transformer2DOptions to;
  to.heads = 2;
  to.head_dim = 16;
  to.in_channels = 32;
  to.cross_attention_dim = 24;
  to.norm_num_groups = 8;
  to.use_linear_projection = true;
  nn::Transformer2DModel transformer(to);
  nn::init_random_weights(*transformer, 8);
  resnet->eval();
  transformer->eval();
  auto gen = at::detail::createCPUGenerator(1234);
  auto x = torch::randn({1, 32, 8, 8}, gen, torch::kFloat32);
  auto temb = torch::randn({1, 64}, gen, torch::kFloat32);
  auto context = torch::randn({1, 5, 24}, gen, torch::kFloat32);
  resnet->to(device, dtype);
  transformer->to(device, dtype);
  auto h = resnet->forward(x.to(device, dtype), temb.to(device, dtype));
  auto out = transformer->forward(h, context.to(device, dtype));
  return out.to(torch::kCPU, torch::kFloat32);
}

std::vector<std::string> attention_backends(const torch::Device& device, torch::Dtype dtype) {
  std::vector<std::string> out;
#ifdef DIFFUSE_DOCTOR_ATTENTION_TABLE
  for (auto b : nn::available_attention_backends(device))
    if (b != nn::AttentionBackend::kNpu) out.push_back(nn::attention_backend_name(b));
#else
  out.push_back("math");
  if (c10::Dispatcher::singleton().findSchema({"aten::scaled_dot_product_attention", ""}))
    out.push_back("sdpa");
#endif
  // The npu backend, with the fused kernel it would use for this dtype.
  auto q = torch::zeros({1, 2, 4, 16}, torch::TensorOptions().device(device).dtype(dtype));
  auto kernel = nn::select_npu_attention_kernel(q);
  if (kernel != nn::NpuAttentionKernel::kNone)
    out.push_back(std::string("npu (") + nn::npu_attention_kernel_name(kernel) + ")");
  return out;
}

DeviceCheck check_device(const std::string& name, bool smoke, const torch::Tensor& reference) {
  DeviceCheck c;
  c.name = name;
  try {
    torch::Device d = resolve_device(name);
    c.backend = backend_of(d);
    prepare_device(d);
    if (d.is_cpu()) {
      c.description = cpu_info().model;
      c.total_memory_bytes = host_memory_bytes();
    } else if (d.is_cuda()) {
      cuda::Properties p;
      if (cuda::properties(d.index(), &p)) {
        c.description = p.name + " (sm" + std::to_string(p.major) + std::to_string(p.minor) +
                        (cuda::tf32_allowed() ? ", fp32 matmul/conv in TF32: DIFFUSE_ALLOW_TF32=1)"
                                              : ", fp32 exact: TF32 off)");
        c.total_memory_bytes = p.total_bytes;
      }
    } else if (const NpuBackend* b = npu_backend()) {
      if (b->capabilities) c.description = b->capabilities(d.index()).soc_name;
      if (b->memory_stats) c.total_memory_bytes = b->memory_stats(d.index()).total_bytes;
    }
    for (auto dt : {torch::kFloat32, torch::kBFloat16, torch::kFloat16}) {
      if (dt == torch::kFloat16 && d.is_cpu()) continue;  // never used on the CPU
      if (probe_dtype(d, dt)) c.dtypes.push_back(dtype_name(dt));
    }
    c.bf16_fast = bf16_is_fast(d);
    auto unet = resolve_dtype("auto", d, "unet");
    c.unet_dtype = dtype_name(unet);
    c.vae_dtype = dtype_name(resolve_dtype("auto", d, "vae"));
    c.attention = attention_backends(d, unet);
    c.weight_types = quantized_weight_types(d);
    if (smoke) {
      c.smoke_dtype = c.unet_dtype;
      auto t0 = std::chrono::steady_clock::now();
      auto out = smoke_forward(d, unet);
      c.smoke_seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      c.smoke_max_abs_diff = (out - reference).abs().max().item<double>();
      double scale = std::max(1.0, reference.abs().max().item<double>());
      double tol = unet == torch::kFloat32 ? 1e-3 * scale : 0.1 * scale;
      bool finite = torch::isfinite(out).all().item<bool>();
      c.smoke_ok = finite && c.smoke_max_abs_diff <= tol;
      if (!finite)
        c.error = "smoke test produced non-finite values";
      else if (!c.smoke_ok)
        c.error = "smoke test differs from the CPU by " + std::to_string(c.smoke_max_abs_diff) +
                  " (tolerance " + std::to_string(tol) + ")";
    } else {
      c.smoke_ok = true;
    }
  } catch (const std::exception& e) {
    c.smoke_ok = false;
    c.error = e.what();
  }
  return c;
}

bool config_has(const std::string& config, const char* key) {
  return config.find(std::string(key) + "=ON") != std::string::npos ||
         config.find(std::string(key) + "=1") != std::string::npos;
}

std::string gib(int64_t bytes) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(1)
     << static_cast<double>(bytes) / (1024.0 * 1024.0 * 1024.0) << " GiB";
  return os.str();
}

const char* yes_no(bool b) {
  return b ? "yes" : "no";
}

}  // namespace

DoctorReport run_doctor(const DoctorOptions& options) {
  nn::register_npu_attention_backend();
  DoctorReport r;
  r.diffuse_version = DIFFUSE_VERSION;
  r.libtorch_version = TORCH_VERSION;
  r.torch_config = at::show_config();
  r.cuda_compiled = cuda::compiled_with_cuda();
  r.mkldnn = config_has(r.torch_config, "USE_MKLDNN");
  r.openmp = config_has(r.torch_config, "USE_OPENMP");
  BlasInfo blas = blas_info();
  r.blas_provider = blas.provider;
  r.blas_loaded = blas.loaded;
  r.blas_reference = blas.reference;
  r.blas_threading = blas.threading;
  r.blas_mkl = r.torch_config.find("BLAS_INFO=mkl") != std::string::npos;
  if (const char* cbwr = std::getenv("MKL_CBWR")) r.mkl_cbwr = cbwr;
  const CpuInfo& cpu = cpu_info();
  r.cpu_model = cpu.model;
  r.logical_cpus = cpu.logical_cpus;
  r.avx2 = cpu.avx2;
  r.avx512f = cpu.avx512f;
  r.avx512_bf16 = cpu.avx512_bf16;
  r.amx_bf16 = cpu.amx_bf16;
  r.amx_tile = cpu.amx_tile;
  r.isa_cap = cpu.isa_cap;
  // What a generation will use: the pipelines apply the same policy (DIFFUSE_THREADS, the
  // user's OMP_NUM_THREADS / MKL_NUM_THREADS, else every CPU this process may run on) before
  // they run; LibTorch's own default before that is often 1 on a VM.
  r.intra_op_threads = configure_cpu_threads();
  r.threads_chosen_by_user = cpu_threads_chosen_by_user();
  r.small_model_threads = threads_for_step_work(0.0);
  r.winograd_conv = nn::winograd_enabled();
  {
    // Long enough for /proc/stat's 10 ms ticks to mean something; the doctor only waits here.
    CpuShareMeter meter(r.intra_op_threads);
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    r.cpu_load_now = meter.share();
  }
  r.inter_op_threads = at::get_num_interop_threads();
  r.omp_num_threads = env("OMP_NUM_THREADS");
  r.omp_wait_policy = env("OMP_WAIT_POLICY");
  r.thp_mode = transparent_huge_pages_mode();
  r.malloc_huge_pages = malloc_requests_huge_pages();
  r.cuda_devices = cuda_count();
#ifdef DIFFUSE_WITH_TORCH_NPU
  r.torch_npu_linked = true;
#endif
  if (const NpuBackend* b = npu_backend()) r.npu_backend = b->name;
  r.npu_devices = npu_count();
  r.ascend_toolkit_home = env("ASCEND_TOOLKIT_HOME");
  r.ascend_home_path = env("ASCEND_HOME_PATH");
  std::error_code ec;
  r.usr_local_ascend = std::filesystem::exists("/usr/local/Ascend", ec);
  for (const std::string& home : {r.ascend_toolkit_home, r.ascend_home_path,
                                  std::string("/usr/local/Ascend/ascend-toolkit/latest")}) {
    if (!home.empty() && r.cann_version.empty()) r.cann_version = cann_version(home);
  }
  switch (cpu_fallback_owner()) {
    case FallbackOwner::kDiffuse:
      r.cpu_fallback = "diffuse";
      break;
    case FallbackOwner::kOther:
      r.cpu_fallback = "torch_npu/other";
      break;
    case FallbackOwner::kNone:
      r.cpu_fallback = "none";
      break;
  }

  torch::Tensor reference;
  if (options.smoke_test) {
    try {
      reference = smoke_forward(torch::kCPU, torch::kFloat32);
    } catch (const std::exception& e) {
      r.warnings.push_back(std::string("the CPU reference smoke test failed: ") + e.what());
    }
  }
  bool smoke = options.smoke_test && reference.defined();
  for (const auto& name : available_devices())
    r.devices.push_back(check_device(name, smoke, reference));

  if (r.blas_reference)
    r.warnings.push_back(
        "BLAS is the slow reference implementation (" + r.blas_provider +
        "); install an optimised one, e.g. `apt install libopenblas0-pthread` (~20x faster "
        "matmuls)");
  if (r.blas_provider.empty())
    r.notes.push_back("no sgemm_ symbol is visible: libtorch uses its own (MKL or Eigen) BLAS");
  if (r.cuda_devices == 0 && r.npu_devices == 0)
    r.notes.push_back("No NPU or GPU is present: everything runs on the CPU.");
  if (r.npu_backend == "simulated")
    r.notes.push_back(
        "The npu device is SIMULATED (test-only, CPU memory and CPU kernels): it proves "
        "diffuse's integration logic, not Ascend kernels.");
  if (!r.torch_npu_linked && (r.usr_local_ascend || !r.ascend_toolkit_home.empty()))
    r.notes.push_back(
        "CANN is installed but this build has no torch_npu support: rebuild with "
        "-DDIFFUSE_WITH_TORCH_NPU=ON (docs/ascend.md)");

  r.requested_device = options.device;
  if (!options.device.empty()) {
    try {
      std::string name = device_name(resolve_device(options.device));
      r.requested_device = name;
      r.requested_ok = false;
      for (const auto& d : r.devices) {
        if (d.name != name) continue;
        r.requested_ok = d.smoke_ok;
        if (!d.smoke_ok) r.requested_error = d.error;
      }
      if (!r.requested_ok && r.requested_error.empty())
        r.requested_error = "device '" + name + "' was not checked";
    } catch (const std::exception& e) {
      r.requested_ok = false;
      r.requested_error = e.what();
    }
  }
  return r;
}

nlohmann::json to_json(const DoctorReport& r) {
  nlohmann::json devices = nlohmann::json::array();
  for (const auto& d : r.devices) {
    devices.push_back(
        {{"name", d.name},
         {"description", d.description},
         {"backend", d.backend},
         {"total_memory_bytes", d.total_memory_bytes},
         {"dtypes", d.dtypes},
         {"bf16_fast", d.bf16_fast},
         {"auto_dtype",
          {{"unet", d.unet_dtype}, {"text_encoder", d.unet_dtype}, {"vae", d.vae_dtype}}},
         {"attention", d.attention},
         {"weight_types", d.weight_types},
         {"smoke_test",
          {{"ok", d.smoke_ok},
           {"dtype", d.smoke_dtype},
           {"seconds", d.smoke_seconds},
           {"max_abs_diff_vs_cpu", d.smoke_max_abs_diff}}},
         {"error", d.error}});
  }
  return {
      {"diffuse_version", r.diffuse_version},
      {"libtorch",
       {{"version", r.libtorch_version},
        {"cuda", r.cuda_compiled},
        {"mkldnn", r.mkldnn},
        {"openmp", r.openmp},
        {"config", r.torch_config}}},
      {"blas",
       {{"provider", r.blas_provider},
        {"loaded", r.blas_loaded},
        {"reference", r.blas_reference},
        {"threading", r.blas_threading},
        {"mkl", r.blas_mkl},
        {"mkl_cbwr", r.mkl_cbwr}}},
      {"cpu",
       {{"model", r.cpu_model},
        {"logical_cpus", r.logical_cpus},
        {"avx2", r.avx2},
        {"avx512f", r.avx512f},
        {"avx512_bf16", r.avx512_bf16},
        {"amx_bf16", r.amx_bf16},
        {"amx_tile", r.amx_tile},
        {"isa_cap", r.isa_cap},
        {"winograd_conv", r.winograd_conv}}},
      {"memory",
       {{"transparent_huge_pages", r.thp_mode}, {"malloc_huge_pages", r.malloc_huge_pages}}},
      {"threads",
       {{"intra_op", r.intra_op_threads},
        {"inter_op", r.inter_op_threads},
        {"chosen_by_user", r.threads_chosen_by_user},
        {"small_model", r.small_model_threads},
        {"small_model_below_gflop_per_step", kSmallStepFlops / 1e9},
        {"OMP_NUM_THREADS", r.omp_num_threads},
        {"OMP_WAIT_POLICY", r.omp_wait_policy}}},
      {"cpu_load", cpu_share_json(r.cpu_load_now)},
      {"cuda", {{"compiled", r.cuda_compiled}, {"devices", r.cuda_devices}}},
      {"npu",
       {{"torch_npu_linked", r.torch_npu_linked},
        {"backend", r.npu_backend},
        {"devices", r.npu_devices},
        {"ASCEND_TOOLKIT_HOME", r.ascend_toolkit_home},
        {"ASCEND_HOME_PATH", r.ascend_home_path},
        {"usr_local_ascend", r.usr_local_ascend},
        {"cann_version", r.cann_version},
        {"cpu_fallback", r.cpu_fallback}}},
      {"devices", devices},
      {"requested_device",
       {{"name", r.requested_device}, {"ok", r.requested_ok}, {"error", r.requested_error}}},
      {"warnings", r.warnings},
      {"notes", r.notes},
  };
}

std::string to_text(const DoctorReport& r) {
  std::ostringstream os;
  os << "diffuse " << r.diffuse_version << " doctor\n";
  os << "libtorch " << r.libtorch_version << ": CUDA " << yes_no(r.cuda_compiled) << ", oneDNN "
     << yes_no(r.mkldnn) << ", OpenMP " << yes_no(r.openmp) << "\n";
  os << "BLAS: " << (r.blas_provider.empty() ? "(no sgemm_ visible)" : r.blas_provider)
     << (r.blas_threading.empty() ? "" : " (" + r.blas_threading + ")")
     << (r.blas_reference ? "  <- SLOW reference BLAS" : "")
     << (r.blas_mkl ? "; MKL, reproducible mode " + (r.mkl_cbwr.empty()
                                                         ? std::string("off (MKL_CBWR unset)")
                                                         : "MKL_CBWR=" + r.mkl_cbwr)
                    : "")
     << "\n";
  os << "CPU: " << r.cpu_model << ", " << r.logical_cpus << " logical CPUs; AVX2 " << yes_no(r.avx2)
     << ", AVX-512 " << yes_no(r.avx512f) << ", AVX512-BF16 " << yes_no(r.avx512_bf16) << ", AMX "
     << yes_no(r.amx_tile) << " (AMX-BF16 " << yes_no(r.amx_bf16) << ")"
     << (r.isa_cap == "native" ? "" : "; capped to " + r.isa_cap + " by DIFFUSE_CPU_ISA") << "\n";
  os << "float32 3x3 convolutions: "
     << (r.winograd_conv ? "Winograd F(4x4) or F(2x2) where the batch has enough tiles and "
                           "channels, else oneDNN's direct ones"
                         : "oneDNN's direct ones (DIFFUSE_WINOGRAD=0)")
     << "\n";
  os << "threads: intra-op " << r.intra_op_threads;
  if (!r.threads_chosen_by_user && r.small_model_threads != r.intra_op_threads)
    os << " (" << r.small_model_threads << " for a model whose step is under "
       << kSmallStepFlops / 1e9 << " GFLOP, like the demo model at 128x128)";
  os << ", inter-op " << r.inter_op_threads << " (OMP_NUM_THREADS "
     << (r.omp_num_threads.empty() ? "unset" : r.omp_num_threads) << ", OMP_WAIT_POLICY "
     << (r.omp_wait_policy.empty() ? "unset" : r.omp_wait_policy)
     << (r.omp_wait_policy.empty() && r.blas_threading == "pthreads"
             ? ": idle OpenMP workers spin and slow OpenBLAS's own threads; the diffuse CLI "
               "restarts with OMP_WAIT_POLICY=PASSIVE"
             : "")
     << ")\n";
  if (r.cpu_load_now.others >= 0)
    os << "CPU load now: " << describe_cpu_share(r.cpu_load_now)
       << (r.cpu_load_now.crowded()
               ? " (busy: a generation on more than one thread waits for them at every operator)"
               : "")
       << "\n";
  os << "heap: transparent huge pages " << (r.thp_mode.empty() ? "unknown" : r.thp_mode)
     << ", malloc " << (r.malloc_huge_pages ? "uses them" : "does not ask for them")
     << (r.malloc_huge_pages ? ""
                             : " (diffuse restarts with GLIBC_TUNABLES=glibc.malloc.hugetlb=1)")
     << "\n";
  os << "CUDA: "
     << (r.cuda_compiled ? std::to_string(r.cuda_devices) + " device(s)" : "not in this libtorch")
     << "\n";
  os << "Ascend NPU: ";
  if (r.npu_backend.empty())
    os << "no support in this build (-DDIFFUSE_WITH_TORCH_NPU=OFF)";
  else
    os << r.npu_backend << ", " << r.npu_devices << " device(s)";
  os << "; CANN: ";
  if (!r.ascend_toolkit_home.empty() || !r.ascend_home_path.empty() || r.usr_local_ascend) {
    os << (r.cann_version.empty() ? "found" : r.cann_version) << " (ASCEND_TOOLKIT_HOME="
       << (r.ascend_toolkit_home.empty() ? "unset" : r.ascend_toolkit_home)
       << ", /usr/local/Ascend " << (r.usr_local_ascend ? "present" : "absent") << ")";
  } else {
    os << "not found (ASCEND_TOOLKIT_HOME and ASCEND_HOME_PATH unset, /usr/local/Ascend absent)";
  }
  os << "; CPU fallback for npu operators: " << r.cpu_fallback << "\n";
  os << "devices:\n";
  for (const auto& d : r.devices) {
    os << "  " << std::left << std::setw(7) << d.name << " " << d.backend;
    if (!d.description.empty()) os << ", " << d.description;
    if (d.total_memory_bytes > 0) os << ", " << gib(d.total_memory_bytes);
    os << "\n";
    if (!d.dtypes.empty() || !d.unet_dtype.empty()) {
      os << "          dtypes: " << join_list(d.dtypes) << " (bf16 "
         << (d.bf16_fast ? "fast" : "not native") << "); auto picks unet/text " << d.unet_dtype
         << ", vae " << d.vae_dtype << "\n";
      os << "          attention: " << join_list(d.attention) << "\n";
      if (!d.weight_types.empty())
        os << "          --weights: " << join_list(d.weight_types)
           << " (else dequantized per layer into " << d.unet_dtype << ")\n";
    }
    if (!d.smoke_dtype.empty() || !d.error.empty()) {
      os << "          smoke test: " << (d.smoke_ok ? "ok" : "FAILED");
      if (!d.smoke_dtype.empty()) {
        os << " (" << d.smoke_dtype << ", " << std::fixed << std::setprecision(1)
           << d.smoke_seconds * 1000 << " ms, max |diff| vs cpu " << std::scientific
           << std::setprecision(1) << d.smoke_max_abs_diff << ")";
        os << std::defaultfloat;
      }
      if (!d.error.empty()) os << ": " << d.error;
      os << "\n";
    }
  }
  for (const auto& w : r.warnings) os << "WARNING: " << w << "\n";
  for (const auto& n : r.notes) os << "note: " << n << "\n";
  if (!r.requested_device.empty()) {
    if (r.requested_ok)
      os << "requested device " << r.requested_device << ": ready\n";
    else
      os << "requested device " << r.requested_device << ": CANNOT RUN: " << r.requested_error
         << "\n";
  }
  return os.str();
}

}  // namespace diffuse::device
