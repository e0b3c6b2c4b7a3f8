// `diffuse bench accel -m <HiDream folder>`: the DiT caches against the full computation.
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>

#include "bench/accel_bench.h"
#include "bench/dit_cache_bench.h"
#include "commands.h"

namespace diffuse::app {

int run_dit_cache_bench_command(const bench::DitCacheBenchOptions& options, bool as_json) {
  auto o = options;
  if (!as_json) o.log = [](const std::string& line) { std::cerr << line << "\n"; };
  const auto r = bench::run_dit_cache_bench(o);
  if (as_json) {
    nlohmann::json rows = nlohmann::json::array();
    for (const auto& row : r.rows)
      rows.push_back({{"setting", row.name},
                      {"denoise_s", row.denoise_s},
                      {"speedup", row.speedup},
                      {"blocks_run", row.blocks_run},
                      {"edits_fully_right", row.edits.fully_right_rate()},
                      {"edit_objects_right", row.edits.objects_right_rate()},
                      {"txt2img_background", row.txt2img.scores.background_accuracy()},
                      {"txt2img_objects_right", row.txt2img.objects_right_rate()},
                      {"psnr_mean_db", row.psnr_mean},
                      {"psnr_min_db", row.psnr_min}});
    std::cout << nlohmann::json{{"mode", "dit-cache"}, {"model", r.model}, {"device", r.device},
                                {"dtype", r.dtype},    {"steps", r.steps}, {"images", r.images},
                                {"rows", rows}}
                     .dump(2)
              << "\n";
    return 0;
  }
  std::printf("%s, %s %s, %d steps, %d images per setting (%d edits, %d captions, x%d seeds)\n",
              r.model.c_str(), r.device.c_str(), r.dtype.c_str(), r.steps, r.images, o.edits,
              o.prompts, o.seeds);
  std::printf("%-16s %9s %8s %7s %8s %8s %8s %8s %9s %9s\n", "setting", "denoise", "speed-up",
              "blocks", "edit ok", "edit obj", "t2i bg", "t2i obj", "PSNR", "minPSNR");
  for (const auto& row : r.rows)
    std::printf("%-16s %8.2fs %7.2fx %6.1f%% %7.1f%% %7.1f%% %7.1f%% %7.1f%% %7.2fdB %7.2fdB\n",
                row.name.c_str(), row.denoise_s, row.speedup, 100 * row.blocks_run,
                100 * row.edits.fully_right_rate(), 100 * row.edits.objects_right_rate(),
                100 * row.txt2img.scores.background_accuracy(),
                100 * row.txt2img.objects_right_rate(), row.psnr_mean, row.psnr_min);
  std::printf("(speed-up and PSNR against \"%s\" in the same run; PSNR %.0f = identical)\n",
              r.rows[0].name.c_str(), bench::kIdenticalPsnr);
  return 0;
}

}  // namespace diffuse::app
