#include "models/vae_tiling.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <vector>

#include "diffuse/errors.h"
#include "models/config_values.h"

namespace diffuse::models {
namespace {

// b's first rows (columns, for dim 3) that `a`, the tile one stride before it, also covers
// become a ramp from a's values to b's own: at row y of e, a * (1 - y/e) + b * (y/e).
// `offset` is where b starts inside a.
void blend_into(const torch::Tensor& a, torch::Tensor& b, int64_t dim, int64_t offset) {
  const int64_t e = std::min(a.size(dim) - offset, b.size(dim));
  if (e <= 0) return;
  std::vector<double> ramp(static_cast<size_t>(e));
  for (int64_t y = 0; y < e; ++y) ramp[static_cast<size_t>(y)] = static_cast<double>(y) / e;
  auto w = torch::tensor(ramp, torch::TensorOptions().dtype(torch::kFloat64))
               .to(b.device(), torch::kFloat32);
  if (dim == 2) w = w.view({e, 1});
  auto theirs = a.narrow(dim, offset, e).to(torch::kFloat32);
  auto mine = b.narrow(dim, 0, e);
  mine.copy_(theirs * (1 - w) + mine.to(torch::kFloat32) * w);
}

// Runs `fn` on tiles of x ([B, C, H, W]) `tile` pixels wide starting every `stride` pixels,
// blends each result with its upper and left neighbours, and assembles the first `keep`
// output rows and columns of every tile. `fn` maps n input pixels to n * num / den.
torch::Tensor run_tiles(const torch::Tensor& x, int64_t tile, int64_t stride, int64_t num,
                        int64_t den, const std::function<torch::Tensor(const torch::Tensor&)>& fn) {
  const int64_t height = x.size(2), width = x.size(3);
  const int64_t keep = stride * num / den;
  torch::Tensor out;
  std::vector<torch::Tensor> above, row;  // the blended tiles of the previous and this row
  for (int64_t i = 0; i < height; i += stride) {
    row.clear();
    for (int64_t j = 0; j < width; j += stride) {
      auto part =
          fn(x.slice(2, i, std::min(i + tile, height)).slice(3, j, std::min(j + tile, width)));
      if (i > 0) blend_into(above[row.size()], part, 2, keep);
      if (j > 0) blend_into(row.back(), part, 3, keep);
      if (!out.defined())
        out = torch::empty({x.size(0), part.size(1), height * num / den, width * num / den},
                           part.options());
      const int64_t rows = std::min(keep, part.size(2)), cols = std::min(keep, part.size(3));
      out.narrow(2, i * num / den, rows)
          .narrow(3, j * num / den, cols)
          .copy_(part.narrow(2, 0, rows).narrow(3, 0, cols));
      row.push_back(part);
    }
    std::swap(above, row);
  }
  return out;
}

}  // namespace

int64_t latent_stride(const VaeTiling& t, int64_t factor) {
  return static_cast<int64_t>(std::floor(t.tile_size / factor * (1.0 - t.overlap) + 1e-9));
}

void check_vae_tiling(const VaeTiling& t, const AutoencoderKLConfig& c) {
  const int64_t f = c.spatial_factor();
  if (t.tile_size < 2 * f || t.tile_size % f != 0 || t.tile_size > kMaxImageSide)
    throw InvalidArgument("VAE tile size " + std::to_string(t.tile_size) +
                          " px: expected a multiple of " + std::to_string(f) + " in [" +
                          std::to_string(2 * f) + ", " + std::to_string(kMaxImageSide) +
                          "] (the VAE's " + std::to_string(f) + " pixels per latent pixel)");
  if (!(t.overlap >= 0.0 && t.overlap <= 0.5))
    throw InvalidArgument("VAE tile overlap " + std::to_string(t.overlap) +
                          ": expected a fraction of the tile in [0, 0.5]");
  if (latent_stride(t, f) < 1)
    throw InvalidArgument("VAE tiles of " + std::to_string(t.tile_size) + " px with overlap " +
                          std::to_string(t.overlap) + " would not advance: use larger tiles");
}

bool spans_several_tiles(const VaeTiling& t, int64_t height, int64_t width) {
  return height > t.tile_size || width > t.tile_size;
}

torch::Tensor tiled_decode(AutoencoderKLImpl& vae, const torch::Tensor& z, const VaeTiling& t) {
  check_vae_tiling(t, vae.config());
  if (!z.defined() || z.dim() != 4) return vae.decode(z);  // its own error for malformed latents
  const int64_t f = vae.config().spatial_factor();
  return run_tiles(z, t.tile_size / f, latent_stride(t, f), f, 1,
                   [&](const torch::Tensor& tile) { return vae.decode(tile); });
}

LatentDist tiled_encode(AutoencoderKLImpl& vae, const torch::Tensor& x, const VaeTiling& t) {
  check_vae_tiling(t, vae.config());
  if (!x.defined() || x.dim() != 4) return vae.encode(x);  // its own error for malformed input
  const int64_t f = vae.config().spatial_factor();
  if (x.size(2) % f != 0 || x.size(3) % f != 0) return vae.encode(x);  // the same
  auto moments = run_tiles(x, t.tile_size, latent_stride(t, f) * f, 1, f,
                           [&](const torch::Tensor& tile) { return vae.encode_moments(tile); });
  return LatentDist::from_moments(moments);
}

}  // namespace diffuse::models
