// `diffuse bench vae-tiling`: the VAE decode of one image whole and in tiles at several sizes
// (SD2.1-base's VAE with random weights by default, or a model's own VAE), with time and peak
// RSS of each, and how far the tiled image is from the whole one at the first size.
#pragma once
#include <functional>
#include <string>
#include <vector>

namespace diffuse::bench {

struct VaeTilingBenchOptions {
  std::string arch = "sd2.1-base";
  std::string model;  // a diffusers folder whose VAE to use instead of `arch`'s random one
  std::string device = "auto", dtype = "auto";
  std::vector<int> sizes{512, 1024};  // square images, pixels
  int tile_size = 0;                  // 0: the VAE config's sample_size (else 512)
  int compare_tile = 256;             // tiles for the tiled-vs-whole difference at sizes[0]
  int whole_max = 2048;               // the whole-image decode runs only up to this size
  uint64_t seed = 0;
  std::function<void(const std::string&)> log;
};

struct VaeDecodeRun {
  int size = 0;
  bool tiled = false;
  int tile_size = 0, tiles = 0;  // tiles: 1 when whole
  double seconds = 0;
  double peak_rss_mb = 0;   // process peak during the decode (0 where it cannot be reset)
  double extra_rss_mb = 0;  // that peak minus the RSS before it
};

struct VaeTilingBenchResult {
  std::string vae, device, dtype;
  double vae_params_m = 0;
  std::vector<VaeDecodeRun> runs;
  // At sizes[0]: tiles of compare_tile vs the whole image, pixels in [0, 1].
  int compare_size = 0, compare_tile = 0;
  double max_abs_diff = 0, psnr_db = 0;
};

VaeTilingBenchResult run_vae_tiling_bench(const VaeTilingBenchOptions& options);

}  // namespace diffuse::bench
