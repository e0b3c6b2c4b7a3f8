// `diffuse bench accel`: DeepCache and token merging vs the full computation
// (bench/accel_bench.h): quality on the demo model, or denoising speed at full size.
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>

#include "accel/dit_cache.h"
#include "bench/accel_bench.h"
#include "bench/dit_cache_bench.h"
#include "commands.h"
#include "diffuse/errors.h"
#include "io/model_folder.h"
#include "pipeline/hidream.h"
#include "pipeline/hidream_variant.h"

namespace diffuse::app {

std::pair<CLI::App*, Command> add_bench_accel(CLI::App& bench) {
  struct Flags {
    bench::AccelBenchOptions opts;
    int layer = 0, block = 0;
    bool non_uniform = false;
    bool json = false;
    int edits = 20;                   // HiDream models
    std::vector<std::string> caches;  // HiDream models: --cache specs (default: a spread)
  };
  auto f = std::make_shared<Flags>();
  CLI::App* sub = bench.add_subcommand(
      "accel",
      "DeepCache and token merging vs full computation: quality (demo model) or speed "
      "(--arch, random weights)");
  sub->add_option("-m,--model", f->opts.model, "Demo-world model folder (quality)")
      ->capture_default_str();
  sub->add_option("--arch", f->opts.arch,
                  "Speed only, on a built-in architecture with random weights (sd2.1-base)");
  sub->add_option("--prompts", f->opts.prompts, "Held-out prompts")->capture_default_str();
  sub->add_option("--seeds", f->opts.seeds, "Seeds per prompt")->capture_default_str();
  sub->add_option("--steps", f->opts.steps, "Denoising steps")->capture_default_str();
  sub->add_option("--scheduler", f->opts.scheduler, "Scheduler")->capture_default_str();
  sub->add_option("--cfg-scale", f->opts.guidance_scale, "Guidance scale")->capture_default_str();
  sub->add_option("-W,--width", f->opts.width, "Width (default: the model's)");
  sub->add_option("-H,--height", f->opts.height, "Height (default: the model's)");
  sub->add_option("--repeats", f->opts.repeats, "Speed: denoising loops per setting (fastest)")
      ->capture_default_str();
  sub->add_option("--device", f->opts.device, "Device")->capture_default_str();
  sub->add_option("--dtype", f->opts.dtype, "auto|fp32|bf16|fp16")->capture_default_str();
  sub->add_option("--attention", f->opts.attention, "Attention backend")->capture_default_str();
  sub->add_option("--deepcache-layer", f->layer, "cache_layer_id of the DeepCache settings")
      ->capture_default_str();
  sub->add_option("--deepcache-block", f->block, "cache_block_id of the DeepCache settings")
      ->capture_default_str();
  sub->add_flag("--non-uniform", f->non_uniform, "DeepCache settings: non-uniform schedule");
  sub->add_option("--edits", f->edits, "HiDream models: held-out edits")->capture_default_str();
  sub->add_option("--cache", f->caches,
                  "HiDream models: DiT cache settings to compare with off (repeat; default: a "
                  "spread of fbcache, taylorseer and ditcache)");
  sub->add_flag("--json", f->json, "Print one JSON object on stdout");
  Command run = [f, sub]() {
    if (f->opts.arch.empty() && pipeline::is_hidream_folder(f->opts.model)) {
      bench::DitCacheBenchOptions o;
      o.model = f->opts.model;
      o.edits = f->edits;
      o.prompts = f->opts.prompts;
      o.seeds = f->opts.seeds;
      if (sub->count("--steps") > 0) o.steps = f->opts.steps;
      o.device = f->opts.device;
      o.dtype = f->opts.dtype;
      if (!f->caches.empty()) {
        o.settings = {{"off", DitCacheOptions()}};
        // A bare method name is the folder's measured setting, named as such.
        const auto folder = io::ModelFolder::open(f->opts.model);
        for (const auto& c : f->caches) {
          const auto spec = pipeline::dit_cache_spec(folder, c);
          o.settings.push_back(
              {spec == c ? c : c + " (" + spec + ")", accel::parse_dit_cache(spec)});
        }
      }
      return run_dit_cache_bench_command(o, f->json);
    }
    if (!f->caches.empty())
      throw InvalidArgument("bench accel --cache: the DiT caches need a HiDream model (-m)");
    auto opts = f->opts;
    for (auto& s : opts.settings) {
      s.deep_cache.layer_id = f->layer;
      s.deep_cache.block_id = f->block;
      s.deep_cache.non_uniform = f->non_uniform;
      if (s.deep_cache.interval > 1 && (f->layer || f->block || f->non_uniform))
        s.name += " @" + std::to_string(f->layer) + ":" + std::to_string(f->block) +
                  (f->non_uniform ? " nu" : "");
    }
    if (!f->json) opts.log = [](const std::string& line) { std::cerr << line << "\n"; };
    const auto r = bench::run_accel_bench(opts);
    const bool quality = r.mode == "quality";
    if (f->json) {
      nlohmann::json rows = nlohmann::json::array();
      for (const auto& row : r.rows) {
        nlohmann::json j = {{"setting", row.name},
                            {"denoise_s", row.denoise_s},
                            {"speedup", row.speedup},
                            {"full_unet_steps", row.full_steps}};
        if (row.tome_site_speedup > 0) {
          j["tome_site_speedup"] = row.tome_site_speedup;
          if (row.tome_call_speedup > 0) {
            j["tome_call_speedup"] = row.tome_call_speedup;
            j["tome_auto_policy"] = row.tome_kept ? "kept" : "left out";
          }
        }
        if (quality) {
          j["background_accuracy"] = row.tally.background_accuracy();
          j["colour_position_accuracy"] = row.tally.colour_position_accuracy();
          j["shape_accuracy"] = row.tally.shape_accuracy();
          j["psnr_mean_db"] = row.psnr_mean;
          j["psnr_min_db"] = row.psnr_min;
          j["ssim_mean"] = row.ssim_mean;
        }
        rows.push_back(j);
      }
      std::cout << nlohmann::json{{"mode", r.mode},
                                  {"model", r.model},
                                  {"device", r.device},
                                  {"dtype", r.dtype},
                                  {"width", r.width},
                                  {"height", r.height},
                                  {"steps", r.steps},
                                  {"scheduler", opts.scheduler},
                                  {"images", quality ? opts.prompts * opts.seeds : 0},
                                  {"rows", rows}}
                       .dump(2)
                << "\n";
      return 0;
    }
    std::printf("%s, %s %s, %dx%d, %d steps %s", r.model.c_str(), r.device.c_str(), r.dtype.c_str(),
                r.width, r.height, r.steps, opts.scheduler.c_str());
    if (quality) std::printf(", %d prompts x %d seeds", opts.prompts, opts.seeds);
    std::printf("\n%-24s %6s %10s %8s", "setting", "full", "denoise", "speed-up");
    if (quality)
      std::printf(" %6s %6s %6s %9s %9s %6s", "bg%", "obj%", "shape%", "PSNR", "minPSNR", "SSIM");
    std::printf("\n");
    for (const auto& row : r.rows) {
      std::printf("%-24s %3d/%-2d %9.2fs %7.2fx", row.name.c_str(), row.full_steps, r.steps,
                  row.denoise_s, row.speedup);
      if (quality)
        std::printf(" %6.1f %6.1f %6.1f %7.2fdB %7.2fdB %6.3f",
                    100 * row.tally.background_accuracy(),
                    100 * row.tally.colour_position_accuracy(), 100 * row.tally.shape_accuracy(),
                    row.psnr_mean, row.psnr_min, row.ssim_mean);
      if (row.tome_call_speedup > 0)
        std::printf("   auto policy: %s (merged sites %.2fx, UNet call %.3fx)",
                    row.tome_kept ? "kept" : "left out", row.tome_site_speedup,
                    row.tome_call_speedup);
      else if (row.tome_site_speedup > 0)
        std::printf("   merged sites %.2fx (the policy's verdict needs the \"off\" setting)",
                    row.tome_site_speedup);
      std::printf("\n");
    }
    std::printf("(speed-up and PSNR/SSIM against \"%s\" in the same run; PSNR %.0f = identical)\n",
                r.rows[0].name.c_str(), bench::kIdenticalPsnr);
    return 0;
  };
  return {sub, run};
}

}  // namespace diffuse::app
