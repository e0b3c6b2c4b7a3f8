// One line about the machine at the start of every test's output, which CTest shows only for
// a failing test: a failure seen on another machine (CI) then says which CPU it ran on.
// Linked into the test binaries built on diffuse_core (not the sanitizer job's parser tests),
// with the start-up settings of the CLI processes those tests run (below).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "device/cpu_allocator.h"
#include "device/cpu_info.h"
#include "device/memory.h"

namespace diffuse::test {
namespace machine_line {

class MachineLine : public ::testing::Environment {
 public:
  void SetUp() override {
    const auto& cpu = device::cpu_info();
    const std::string thp = device::transparent_huge_pages_mode();
    std::printf(
        "machine: %s, %d logical CPUs, AVX512-BF16 %s, AMX %s, huge pages %s, %.1f GiB "
        "available\n",
        cpu.model.c_str(), cpu.logical_cpus, cpu.avx512_bf16 ? "yes" : "no",
        cpu.amx_tile ? "yes" : "no", thp.empty() ? "unknown" : thp.c_str(),
        static_cast<double>(device::host_available_bytes()) / (1 << 30));
  }
};

const auto* const kRegistered = ::testing::AddGlobalTestEnvironment(new MachineLine);

// The CLI restarts itself once with glibc's huge-page tunable and OpenMP's passive waiting
// (app/startup_env.h), loading LibTorch twice: 0.7 of its 1.4 s start-up here. The suite starts
// the CLI hundreds of times, so the processes it starts get both settings up front (unless the
// caller set them); Doctor.* clears them to test the restart itself.
class CliStartSettings : public ::testing::Environment {
 public:
  void SetUp() override {
    ::setenv("DIFFUSE_HUGE_PAGES", "0", 0);
    ::setenv("OMP_WAIT_POLICY", "PASSIVE", 0);
  }
};

const auto* const kCliStart = ::testing::AddGlobalTestEnvironment(new CliStartSettings);

}  // namespace machine_line
}  // namespace diffuse::test
