#include "pipeline/flow_decode.h"

#include <torch/torch.h>

#include <chrono>

#include "device/memory.h"
#include "pipeline/finite_check.h"
#include "pipeline/memory_report.h"
#include "pipeline/vae_tiling_policy.h"

namespace diffuse::pipeline {

torch::Tensor decode_flow_latents(models::AutoencoderKL& vae, const torch::Tensor& latents,
                                  const VaeTilingOptions& tiling, const torch::Device& vae_device,
                                  StageTimings& timings, std::vector<std::string>& warnings) {
  const auto start = std::chrono::steady_clock::now();
  device::reset_peak_memory(vae_device);
  const auto& vc = vae->config();
  const int64_t f = vc.spatial_factor();
  const auto choice = choose_vae_tiling(tiling, vc, latents.size(0), latents.size(2) * f,
                                        latents.size(3) * f, vae_device, torch::kFloat32);
  if (!choice.warning.empty()) warnings.push_back(choice.warning);
  auto decoded =
      vae_decode(*vae, vc.from_latents(latents.to(vae_device, torch::kFloat32)), choice.tiling);
  auto image = (decoded.to(torch::kFloat32) / 2 + 0.5)
                   .clamp(0, 1)
                   .permute({0, 2, 3, 1})
                   .contiguous()
                   .to(torch::kCPU);
  check_stage_finite(image, "VAE decoder", vae_device, torch::kFloat32);
  timings.vae_decode_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  record_stage_memory(&timings, "vae_decode", vae_device);
  timings.peak_rss_bytes = device::memory_stats().peak_rss_bytes;
  return image;
}

}  // namespace diffuse::pipeline
