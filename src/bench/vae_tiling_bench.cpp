#include "bench/vae_tiling_bench.h"

#include <torch/torch.h>

#include <cmath>

#include "bench/bench_util.h"
#include "device/cpu_allocator.h"
#include "device/cpu_threads.h"
#include "device/device.h"
#include "device/memory.h"
#include "diffuse/errors.h"
#include "io/json_config.h"
#include "models/autoencoder_kl.h"
#include "models/builtin_configs.h"
#include "models/vae_tiling.h"
#include "nn/attention.h"
#include "nn/layers.h"
#include "nn/random_init.h"
#include "pipeline/vae_tiling_policy.h"

namespace diffuse::bench {
namespace {

models::AutoencoderKL build_vae(const VaeTilingBenchOptions& o, torch::Device device,
                                torch::Dtype dtype, std::string* name) {
  if (!o.model.empty()) {
    *name = o.model + " (vae)";
    return models::load_vae(io::ModelFolder::open(o.model), device, dtype);
  }
  const auto& arch = models::builtin_arch(o.arch);
  *name = arch.name + " vae, random weights";
  models::AutoencoderKL vae{nullptr};
  {
    nn::SkipInitGuard guard(dtype);
    vae = models::AutoencoderKL(models::AutoencoderKLConfig::from_json(
        io::JsonConfig(arch.vae, "built-in " + arch.name + " vae config")));
  }
  nn::init_pooled_random_weights(*vae, o.seed + 3);
  vae->to(device, dtype);
  vae->eval();
  return vae;
}

int64_t count_tiles(const models::VaeTiling& t, int64_t latent_side, int64_t f) {
  const int64_t stride = models::latent_stride(t, f);
  const int64_t per_side = (latent_side + stride - 1) / stride;
  return per_side * per_side;
}

}  // namespace

VaeTilingBenchResult run_vae_tiling_bench(const VaeTilingBenchOptions& o) {
  if (o.sizes.empty()) throw InvalidArgument("--sizes: give at least one image size");
  torch::InferenceMode inference;
  device::configure_cpu_threads();
  device::set_cpu_memory_policy();
  const torch::Device device = device::resolve_device(o.device);
  const torch::Dtype dtype = device::resolve_dtype(o.dtype, device, "vae");
  nn::set_default_attention_backend(nn::attention_backend_from_flag_or_env("auto", device));
  VaeTilingBenchResult r;
  auto vae = build_vae(o, device, dtype, &r.vae);
  r.device = device::device_name(device);
  r.dtype = device::dtype_name(dtype);
  r.vae_params_m = params_m(*vae);
  const auto& cfg = vae->config();
  const int64_t f = cfg.spatial_factor();
  for (int s : o.sizes)
    if (s < f || s % f != 0 || s > 8192)
      throw InvalidArgument("--sizes: " + std::to_string(s) + " is not a multiple of " +
                            std::to_string(f) + " in [" + std::to_string(f) + ", 8192]");

  VaeTilingOptions opts;
  opts.mode = "on";
  opts.tile_size = o.tile_size;
  auto decode = [&](const torch::Tensor& z, const std::optional<models::VaeTiling>& tiling) {
    auto img = pipeline::vae_decode(*vae, z, tiling);
    sync_device(device);
    return (img.to(torch::kFloat32) / 2 + 0.5).clamp(0, 1).to(torch::kCPU);
  };
  torch::Tensor compare_whole;
  for (size_t k = 0; k < o.sizes.size(); ++k) {
    const int size = o.sizes[k];
    auto gen = at::detail::createCPUGenerator(o.seed + 6);
    auto z = torch::randn({1, cfg.latent_channels, size / f, size / f}, gen,
                          torch::TensorOptions().dtype(torch::kFloat32))
                 .to(device, dtype);
    const auto tiling = pipeline::choose_vae_tiling(opts, cfg, 1, size, size, device, dtype).tiling;
    for (bool tiled : {false, true}) {
      if (!tiled && size > o.whole_max) continue;
      if (tiled && !tiling) continue;                          // one tile: the same as whole
      device::empty_cache(device, device::HeapRelease::kAll);  // each run's own peak
      VaeDecodeRun run;
      run.size = size;
      run.tiled = tiled;
      run.tile_size = tiled ? static_cast<int>(tiling->tile_size) : size;
      run.tiles = tiled ? static_cast<int>(count_tiles(*tiling, size / f, f)) : 1;
      const double before = mb(current_rss_bytes());
      double overall = 0;
      StagePeak peak(&overall);
      const double t0 = now_s();
      auto img = decode(z, tiled ? tiling : std::nullopt);
      run.seconds = now_s() - t0;
      run.peak_rss_mb = peak.finish();
      run.extra_rss_mb = run.peak_rss_mb > 0 ? run.peak_rss_mb - before : 0;
      if (k == 0 && !tiled) compare_whole = img;
      r.runs.push_back(run);
      if (o.log)
        o.log(std::to_string(size) + "x" + std::to_string(size) + " " +
              (tiled ? "tiled (" + std::to_string(run.tiles) + " tiles of " +
                           std::to_string(run.tile_size) + " px)"
                     : std::string("whole")) +
              ": " + fmt("%.2f s", run.seconds) + ", peak RSS " + fmt("%.0f MiB", run.peak_rss_mb));
    }
    if (k == 0 && compare_whole.defined()) {
      VaeTilingOptions small = opts;
      small.tile_size = o.compare_tile;
      const auto t = pipeline::choose_vae_tiling(small, cfg, 1, size, size, device, dtype).tiling;
      if (t) {
        auto tiled = decode(z, t);
        r.compare_size = size;
        r.compare_tile = o.compare_tile;
        r.max_abs_diff = (tiled - compare_whole).abs().max().item<double>();
        const double mse = (tiled - compare_whole).pow(2).mean().item<double>();
        r.psnr_db = mse > 0 ? 10 * std::log10(1.0 / mse) : INFINITY;
      }
    }
  }
  return r;
}

}  // namespace diffuse::bench
