#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cli_run.h"
#include "device/cpu_info.h"
#include "device/doctor.h"
#include "nn/int8_linear.h"

namespace diffuse {
namespace test_doctor {

using test::run_cli;

TEST(Doctor, ReportsTheCpuAndRunsItsSmokeTest) {
  device::DoctorOptions o;
  o.device = "cpu";
  auto r = device::run_doctor(o);
  EXPECT_EQ(r.libtorch_version, TORCH_VERSION);
  EXPECT_FALSE(r.torch_config.empty());
  ASSERT_FALSE(r.devices.empty());
  const auto& cpu = r.devices[0];
  EXPECT_EQ(cpu.name, "cpu");
  EXPECT_TRUE(cpu.smoke_ok) << cpu.error;
  EXPECT_NE(std::find(cpu.dtypes.begin(), cpu.dtypes.end(), "fp32"), cpu.dtypes.end());
  EXPECT_EQ(std::find(cpu.dtypes.begin(), cpu.dtypes.end(), "fp16"),
            cpu.dtypes.end());               // never probed on CPU
  EXPECT_EQ(cpu.vae_dtype, cpu.unet_dtype);  // one policy for every CPU component
  EXPECT_NE(std::find(cpu.attention.begin(), cpu.attention.end(), "math"), cpu.attention.end());
  // The --weights types dequantize on the CPU as ggml's reference does; int8 says whether it
  // multiplies in 8-bit integers here.
  const std::string int8 =
      nn::int8_gemm_available() ? "int8 (8-bit integer products: AVX512-VNNI)" : "int8";
  EXPECT_EQ(cpu.weight_types, (std::vector<std::string>{"q8_0", "q4_0", int8}));
  EXPECT_GT(cpu.total_memory_bytes, 0);
  EXPECT_TRUE(r.requested_ok);
  EXPECT_EQ(r.requested_device, "cpu");
  EXPECT_GT(r.intra_op_threads, 0);
  EXPECT_EQ(r.blas_reference, device::blas_info().reference);
}

TEST(Doctor, SaysPlainlyWhenThereIsNoAccelerator) {
  auto r = device::run_doctor({"", false});
  if (r.cuda_devices > 0 || r.npu_devices > 0) GTEST_SKIP() << "this machine has an accelerator";
  auto text = device::to_text(r);
  EXPECT_NE(text.find("No NPU or GPU is present"), std::string::npos) << text;
  EXPECT_NE(text.find("Ascend NPU: no support in this build"), std::string::npos) << text;
  auto j = device::to_json(r);
  EXPECT_EQ(j["npu"]["devices"], 0);
  EXPECT_EQ(j["devices"].size(), 1u);
}

TEST(Doctor, RequestedDeviceThatCannotRunIsReported) {
  for (const char* spec : {"npu:3", "tpu", "cuda:7"}) {
    auto r = device::run_doctor({spec, false});
    EXPECT_FALSE(r.requested_ok) << spec;
    EXPECT_FALSE(r.requested_error.empty()) << spec;
  }
}

TEST(Doctor, CliJsonAndExitStatus) {
  test::TempDir dir;
  auto ok = run_cli({"doctor", "--json", "--device", "cpu"}, dir);
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
  auto j = nlohmann::json::parse(ok.out);
  EXPECT_EQ(j["requested_device"]["ok"], true);
  EXPECT_TRUE(j["devices"][0]["smoke_test"]["ok"].get<bool>());
  EXPECT_TRUE(j.contains("blas"));
  // The CLI asks MKL for alignment-independent results before anything runs, and says so (the
  // value also reaches a LibTorch without MKL, where it does nothing).
  const char* preset = std::getenv("MKL_CBWR");  // a user's own value wins
  EXPECT_EQ(j["blas"]["mkl_cbwr"], preset ? preset : "AUTO,STRICT");
  EXPECT_EQ(j["blas"]["mkl"].get<bool>(),
            j["libtorch"]["config"].get<std::string>().find("BLAS_INFO=mkl") != std::string::npos);
  EXPECT_TRUE(j["cpu"].contains("amx_bf16"));
  const char* cap = std::getenv("DIFFUSE_CPU_ISA");  // scripts/bench_isa.sh sets it
  EXPECT_EQ(j["cpu"]["isa_cap"], cap && *cap ? cap : "native");
  auto bad = run_cli({"doctor", "--no-smoke-test", "--device", "npu:9"}, dir);
  EXPECT_EQ(bad.exit_code, 1) << bad.out;
  EXPECT_NE(bad.out.find("CANNOT RUN"), std::string::npos) << bad.out;
}

// DIFFUSE_CPU_ISA=avx2 makes this CPU look like an AVX2-only one to the engine: no AVX-512 or
// native bf16 in doctor, float32 from the auto dtype policy, the avx2 flash kernel.
TEST(Doctor, CpuIsaCapIsReportedAndAppliedToTheDtypePolicy) {
  test::TempDir dir;
  auto r = run_cli({"doctor", "--json", "--device", "cpu"}, dir, "DIFFUSE_CPU_ISA=avx2");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["cpu"]["isa_cap"], "avx2");
  EXPECT_FALSE(j["cpu"]["avx512f"].get<bool>());
  EXPECT_FALSE(j["cpu"]["avx512_bf16"].get<bool>());
  EXPECT_FALSE(j["cpu"]["amx_bf16"].get<bool>());
  EXPECT_EQ(j["devices"][0]["auto_dtype"]["unet"], "fp32") << j["devices"][0].dump();
  auto text =
      run_cli({"doctor", "--no-smoke-test", "--device", "cpu"}, dir, "DIFFUSE_CPU_ISA=avx2");
  EXPECT_NE(text.out.find("capped to avx2 by DIFFUSE_CPU_ISA"), std::string::npos) << text.out;
  // A level that does not exist: one line naming the variable and the choices, exit non-zero.
  auto bad = run_cli({"doctor", "--no-smoke-test"}, dir, "DIFFUSE_CPU_ISA=avx9000");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.err.find("DIFFUSE_CPU_ISA='avx9000'"), std::string::npos) << bad.err;
  EXPECT_NE(bad.err.find("native, avx512, avx2 or baseline"), std::string::npos) << bad.err;
}

// Whether float32 3x3 convolutions may take Winograd, in the text and the JSON, and
// DIFFUSE_WINOGRAD=0 turning it off.
TEST(Doctor, SaysHowFloat32ConvolutionsRun) {
  test::TempDir dir;
  auto on = run_cli({"doctor", "--json", "--no-smoke-test", "--device", "cpu"}, dir);
  ASSERT_EQ(on.exit_code, 0) << on.err;
  EXPECT_TRUE(nlohmann::json::parse(on.out)["cpu"]["winograd_conv"].get<bool>());
  auto off = run_cli({"doctor", "--no-smoke-test", "--device", "cpu"}, dir, "DIFFUSE_WINOGRAD=0");
  ASSERT_EQ(off.exit_code, 0) << off.err;
  EXPECT_NE(off.out.find("float32 3x3 convolutions: oneDNN's direct ones (DIFFUSE_WINOGRAD=0)"),
            std::string::npos)
      << off.out;
  auto text = run_cli({"doctor", "--no-smoke-test", "--device", "cpu"}, dir);
  EXPECT_NE(text.out.find("float32 3x3 convolutions: Winograd"), std::string::npos) << text.out;
}

// The CLI restarts itself with glibc's huge-page tunable where THP can be had, and doctor (the
// restarted process) says so; DIFFUSE_HUGE_PAGES=0 keeps the default heap.
TEST(Doctor, TheCliAsksMallocForHugePages) {
  std::ifstream thp("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string mode;
  std::getline(thp, mode);
  const bool available = !mode.empty() && mode.find("[never]") == std::string::npos;
  test::TempDir dir;
  // The suite's environment turns the restart off (tests/CMakeLists.txt): cleared here.
  auto on = run_cli({"doctor", "--json", "--no-smoke-test"}, dir,
                    "env -u DIFFUSE_HUGE_PAGES GLIBC_TUNABLES=");
  ASSERT_EQ(on.exit_code, 0) << on.err;
  auto j = nlohmann::json::parse(on.out);
  EXPECT_EQ(j["memory"]["malloc_huge_pages"].get<bool>(), available) << mode;
  auto off =
      run_cli({"doctor", "--json", "--no-smoke-test"}, dir, "GLIBC_TUNABLES= DIFFUSE_HUGE_PAGES=0");
  ASSERT_EQ(off.exit_code, 0) << off.err;
  EXPECT_FALSE(nlohmann::json::parse(off.out)["memory"]["malloc_huge_pages"].get<bool>());
  // A user's own tunables are kept next to ours.
  auto kept = run_cli({"doctor", "--json", "--no-smoke-test"}, dir,
                      "env -u DIFFUSE_HUGE_PAGES GLIBC_TUNABLES=glibc.malloc.arena_max=2");
  ASSERT_EQ(kept.exit_code, 0) << kept.err;
  EXPECT_EQ(nlohmann::json::parse(kept.out)["memory"]["malloc_huge_pages"].get<bool>(), available);
}

// Beside a pthread OpenBLAS the CLI restarts with OpenMP workers that sleep when idle, so that
// they do not share the cores with OpenBLAS's threads; a user's own policy is kept.
TEST(Doctor, TheCliLetsIdleOpenMpWorkersSleepBesideOpenBlasThreads) {
  test::TempDir dir;
  auto on = run_cli({"doctor", "--json", "--no-smoke-test"}, dir,
                    "env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT");
  ASSERT_EQ(on.exit_code, 0) << on.err;
  auto j = nlohmann::json::parse(on.out);
  const std::string threading = j["blas"]["threading"].get<std::string>();
  EXPECT_EQ(j["threads"]["OMP_WAIT_POLICY"].get<std::string>(),
            threading == "pthreads" ? "PASSIVE" : "")
      << threading;
  auto kept = run_cli({"doctor", "--json", "--no-smoke-test"}, dir, "OMP_WAIT_POLICY=active");
  ASSERT_EQ(kept.exit_code, 0) << kept.err;
  EXPECT_EQ(nlohmann::json::parse(kept.out)["threads"]["OMP_WAIT_POLICY"].get<std::string>(),
            "active");
  auto spin = run_cli({"doctor", "--json", "--no-smoke-test"}, dir,
                      "env -u OMP_WAIT_POLICY GOMP_SPINCOUNT=1000");
  ASSERT_EQ(spin.exit_code, 0) << spin.err;
  EXPECT_EQ(nlohmann::json::parse(spin.out)["threads"]["OMP_WAIT_POLICY"].get<std::string>(), "");
}

TEST(CpuInfo, FeaturesAreConsistent) {
  const auto& c = device::cpu_info();
  EXPECT_GT(c.logical_cpus, 0);
  if (c.avx512_bf16) {
    EXPECT_TRUE(c.avx512f);
  }
  if (c.amx_bf16) {
    EXPECT_TRUE(c.amx_tile);
  }
}

}  // namespace test_doctor
}  // namespace diffuse
