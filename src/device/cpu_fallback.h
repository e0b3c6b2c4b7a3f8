// CPU fallback for the npu device: an aten operator the device has no kernel for runs on the
// CPU with its inputs copied over and its outputs copied back (at::native::cpu_fallback), with
// one warning per operator, as torch_npu's own fallback does. DIFFUSE_CPU_FALLBACK=0 turns
// the fallback into an error naming the operator.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace diffuse::device {

enum class FallbackOwner {
  kNone,     // nothing handles unimplemented npu operators: they fail
  kDiffuse,  // ours (installed by install_cpu_fallback)
  kOther,    // another library's, e.g. torch_npu's npu_cpu_fallback
};

// Registers our boxed fallback for the PrivateUse1 dispatch key unless a fallback is already
// registered there (torch_npu registers its own at load; the dispatcher allows one). Safe to
// call repeatedly. Returns who owns the fallback afterwards.
FallbackOwner install_cpu_fallback();
FallbackOwner cpu_fallback_owner();

// False when DIFFUSE_CPU_FALLBACK is "0", "false", "off" or "no" (read at every fallback, so
// tests and long-running servers can flip it).
bool cpu_fallback_enabled();

struct FallbackRecord {
  std::string op;     // e.g. "aten::sin"
  int64_t calls = 0;  // how often it fell back since the last reset
};
// Operators that fell back through our fallback, in first-use order.
std::vector<FallbackRecord> cpu_fallback_log();
// Clears the log and re-arms the one-per-operator warnings.
void reset_cpu_fallback_log();

}  // namespace diffuse::device
