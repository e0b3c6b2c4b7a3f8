#include "pipeline/cpu_report.h"

#include <algorithm>
#include <cmath>

#include "device/cpu_load.h"

namespace diffuse::pipeline {
std::string cpu_share_note(const CpuShare& share) {
  if (!share.crowded()) return "";
  const int fit = std::max(1, static_cast<int>(std::floor(share.free() + 0.5)));
  return "note: during denoising " + device::describe_cpu_share(share) + ", so the " +
         std::to_string(share.threads) +
         " generation threads often waited for each other; if the steps were much slower than "
         "usual, DIFFUSE_THREADS=" +
         std::to_string(fit) + " may help (small models gain most)";
}

}  // namespace diffuse::pipeline
