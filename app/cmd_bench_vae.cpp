// `diffuse bench vae-tiling`: the VAE decode whole and in tiles at several sizes, with time
// and peak RSS, and the tiled-vs-whole difference (bench/vae_tiling_bench.h).
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>

#include "bench/vae_tiling_bench.h"
#include "commands.h"

namespace diffuse::app {

std::pair<CLI::App*, Command> add_bench_vae_tiling(CLI::App& bench) {
  struct Flags {
    bench::VaeTilingBenchOptions opts;
    bool json = false;
  };
  auto f = std::make_shared<Flags>();
  CLI::App* sub = bench.add_subcommand(
      "vae-tiling", "VAE decode whole vs in tiles: time, peak RSS, and the difference");
  sub->add_option("--arch", f->opts.arch, "Built-in architecture (random weights)")
      ->capture_default_str();
  sub->add_option("-m,--model", f->opts.model, "A diffusers folder whose VAE to use instead");
  sub->add_option("--sizes", f->opts.sizes, "Square image sizes in pixels")->capture_default_str();
  sub->add_option("--tile-size", f->opts.tile_size,
                  "Tile side in pixels (default: the VAE's sample_size, else 512)");
  sub->add_option("--compare-tile", f->opts.compare_tile,
                  "Tile side for the tiled-vs-whole difference at the first size")
      ->capture_default_str();
  sub->add_option("--whole-max", f->opts.whole_max,
                  "Largest size decoded whole (larger ones only in tiles)")
      ->capture_default_str();
  sub->add_option("--device", f->opts.device, "Device")->capture_default_str();
  sub->add_option("--dtype", f->opts.dtype, "auto|fp32|bf16|fp16")->capture_default_str();
  sub->add_flag("--json", f->json, "Print one JSON object on stdout");
  Command run = [f]() {
    auto opts = f->opts;
    if (!f->json) opts.log = [](const std::string& line) { std::cerr << line << "\n"; };
    const auto r = bench::run_vae_tiling_bench(opts);
    if (f->json) {
      nlohmann::json runs = nlohmann::json::array();
      for (const auto& x : r.runs)
        runs.push_back({{"size", x.size},
                        {"tiled", x.tiled},
                        {"tile_size", x.tile_size},
                        {"tiles", x.tiles},
                        {"seconds", x.seconds},
                        {"peak_rss_mb", x.peak_rss_mb},
                        {"extra_rss_mb", x.extra_rss_mb}});
      std::cout << nlohmann::json{{"vae", r.vae},
                                  {"device", r.device},
                                  {"dtype", r.dtype},
                                  {"runs", runs},
                                  {"compare_size", r.compare_size},
                                  {"compare_tile", r.compare_tile},
                                  {"max_abs_diff", r.max_abs_diff},
                                  {"psnr_db", r.psnr_db}}
                       .dump(2)
                << "\n";
      return 0;
    }
    std::printf("%s (%.0fM parameters), %s, %s\n", r.vae.c_str(), r.vae_params_m, r.device.c_str(),
                r.dtype.c_str());
    std::printf("%-11s %-24s %9s %14s %14s\n", "size", "decode", "time", "peak RSS",
                "+ over before");
    for (const auto& x : r.runs) {
      const std::string how =
          x.tiled ? std::to_string(x.tiles) + " tiles of " + std::to_string(x.tile_size) + " px"
                  : "whole";
      std::printf("%4dx%-6d %-24s %8.2fs %10.0f MiB %10.0f MiB\n", x.size, x.size, how.c_str(),
                  x.seconds, x.peak_rss_mb, x.extra_rss_mb);
    }
    if (r.compare_size > 0)
      std::printf(
          "%dx%d in tiles of %d px vs whole: max abs diff %.4f, PSNR %.1f dB (pixels in "
          "[0, 1])\n",
          r.compare_size, r.compare_size, r.compare_tile, r.max_abs_diff, r.psnr_db);
    return 0;
  };
  return {sub, run};
}

}  // namespace diffuse::app
