#include "vae_tiling_flags.h"

#include "flag_checks.h"

namespace diffuse::app {

void add_vae_tiling_flags(CLI::App& app, VaeTilingOptions& o) {
  app.add_option("--vae-tiling", o.mode,
                 "Run the VAE in overlapping tiles so that large images fit in memory: auto "
                 "(above 1024x1024, or when the whole image would not fit), on, off")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "on", "off"}));
  app.add_option("--vae-tile-size", o.tile_size,
                 "Tile side in pixels, a multiple of the VAE's factor (default: the VAE's "
                 "sample_size, else 512)")
      ->check(int_range(16, 8192, "a tile side in pixels"));
  app.add_option("--vae-tile-overlap", o.overlap,
                 "Fraction of a tile blended with its neighbour, in [0, 0.5]")
      ->capture_default_str()
      ->check(number_range(0.0, 0.5, "a fraction of the tile"));
}

}  // namespace diffuse::app
