// The VAE in overlapping tiles (diffusers' AutoencoderKL.enable_tiling(): tiled_encode /
// tiled_decode). Each tile runs through the whole encoder or decoder on its own, so the
// VAE's working memory is one tile's whatever the image size (a 2048x2048 SD decode holds
// ~10 GiB of activations untiled); neighbouring tiles overlap and are blended with linear
// ramps across the overlap, in raster order, each tile with its already-blended upper and
// left neighbours, as diffusers does. Tiles differ slightly from the whole image (GroupNorm
// statistics are per tile), so tiling is for sizes that need it.
//
// One deliberate difference: where the last tile of a row or column is narrower than the
// blend, diffusers blends it with its neighbour's LAST pixels, which lie elsewhere in the
// image; here it is blended with the neighbour's pixels at the same place. Everywhere else
// the result is diffusers' to the rounding of the blend.
#pragma once
#include <torch/types.h>

#include <cstdint>

#include "models/autoencoder_kl.h"

namespace diffuse::models {

struct VaeTiling {
  int64_t tile_size = 512;  // image pixels per tile side (tile_sample_min_size)
  double overlap = 0.25;    // fraction of a tile shared with the next (tile_overlap_factor)
};

// InvalidArgument naming the field unless the tile is a multiple of the VAE's spatial
// factor of at least two latent pixels, the overlap in [0, 0.5], and the stride between
// tiles a whole number of latent pixels.
void check_vae_tiling(const VaeTiling& tiling, const AutoencoderKLConfig& config);

// Latent pixels from one tile's start to the next (diffusers' overlap_size of the decoder).
int64_t latent_stride(const VaeTiling& tiling, int64_t spatial_factor);

// Whether an image of height x width pixels spans more than one tile (diffusers' condition).
bool spans_several_tiles(const VaeTiling& tiling, int64_t height, int64_t width);

// vae.decode(z) tile by tile: z [B, latent_channels, h, w] (unscaled) -> [B, C, h*f, w*f].
torch::Tensor tiled_decode(AutoencoderKLImpl& vae, const torch::Tensor& z, const VaeTiling& tiling);

// vae.encode(x) tile by tile: the posterior of x [B, C, H, W] in [-1, 1] (H, W multiples of
// the spatial factor), its moments blended across tiles.
LatentDist tiled_encode(AutoencoderKLImpl& vae, const torch::Tensor& x, const VaeTiling& tiling);

}  // namespace diffuse::models
