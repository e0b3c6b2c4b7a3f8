#include "pipeline/vae_tiling_policy.h"

#include <torch/torch.h>

#include <algorithm>
#include <cstdio>

#include "device/cpu_allocator.h"
#include "device/memory.h"
#include "diffuse/errors.h"
#include "models/config_values.h"
#include "pipeline/memory_estimate.h"

namespace diffuse::pipeline {
namespace {

// Above this many pixels auto tiles whatever the memory: an SD VAE decode of 1024x1024 already
// holds ~3 GiB of activations in bf16, and beyond it the untiled pass grows with the area.
constexpr int64_t kAutoTilePixels = 1024 * 1024;
constexpr int64_t kDefaultTile = 512;

int64_t default_tile(const models::AutoencoderKLConfig& c) {
  const int64_t f = c.spatial_factor();
  const int64_t side = c.sample_size.empty() ? kDefaultTile : c.sample_size.front();
  // A sample_size that is no valid tile (not a multiple of the factor, or under two latent
  // pixels) says nothing about tiles: the common 512.
  return side >= 2 * f && side % f == 0 ? side : std::max(kDefaultTile, 2 * f);
}

}  // namespace

void validate_vae_tiling_options(const VaeTilingOptions& o) {
  if (o.mode != "auto" && o.mode != "on" && o.mode != "off")
    throw InvalidArgument("vae_tiling mode: expected auto, on or off, got '" + o.mode + "'");
  if (o.tile_size < 0 || o.tile_size > models::kMaxImageSide)
    throw InvalidArgument(
        "vae_tiling tile_size: expected 0 (the VAE's sample_size) or pixels up to " +
        std::to_string(models::kMaxImageSide) + ", got " + std::to_string(o.tile_size));
  if (!(o.overlap >= 0.0 && o.overlap <= 0.5))
    throw InvalidArgument("vae_tiling overlap: expected a fraction of the tile in [0, 0.5], got " +
                          std::to_string(o.overlap));
}

int64_t vae_working_bytes(const models::AutoencoderKLConfig& c,
                          const std::optional<models::VaeTiling>& tiling, int64_t images,
                          int64_t height, int64_t width, torch::Dtype dtype) {
  const int64_t h = tiling ? std::min(height, tiling->tile_size) : height;
  const int64_t w = tiling ? std::min(width, tiling->tile_size) : width;
  return activation_bytes(images, c.block_out_channels.front(), h, w,
                          static_cast<int64_t>(c10::elementSize(dtype)), 3);
}

VaeTilingChoice choose_vae_tiling(const VaeTilingOptions& o, const models::AutoencoderKLConfig& c,
                                  int64_t images, int64_t height, int64_t width,
                                  torch::Device device, torch::Dtype dtype) {
  validate_vae_tiling_options(o);
  VaeTilingChoice choice;
  if (o.mode == "off") return choice;
  models::VaeTiling t;
  t.tile_size = o.tile_size > 0 ? o.tile_size : default_tile(c);
  t.overlap = o.overlap;
  models::check_vae_tiling(t, c);
  if (!models::spans_several_tiles(t, height, width)) return choice;
  if (o.mode == "on" || height * width > kAutoTilePixels) {
    choice.tiling = t;
    return choice;
  }
  const int64_t whole = vae_working_bytes(c, std::nullopt, images, height, width, dtype);
  const int64_t available = device::available_bytes(device);
  if (available > 0 && whole > available) {
    choice.tiling = t;
    choice.warning = "the VAE ran in " + std::to_string(t.tile_size) + " px tiles: the whole " +
                     std::to_string(width) + "x" + std::to_string(height) +
                     " image needs at least " + format_gib(whole) + ", " + format_gib(available) +
                     " available (--vae-tiling off refuses instead; on tiles always)";
  }
  return choice;
}

torch::Tensor vae_decode(models::AutoencoderKLImpl& vae, const torch::Tensor& z,
                         const std::optional<models::VaeTiling>& tiling) {
  device::LargeBuffersReturnedWhenFreed once_per_image;
  return tiling ? models::tiled_decode(vae, z, *tiling) : vae.decode(z);
}

models::LatentDist vae_encode(models::AutoencoderKLImpl& vae, const torch::Tensor& x,
                              const std::optional<models::VaeTiling>& tiling) {
  device::LargeBuffersReturnedWhenFreed once_per_image;
  return tiling ? models::tiled_encode(vae, x, *tiling) : vae.encode(x);
}

}  // namespace diffuse::pipeline
