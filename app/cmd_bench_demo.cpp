// `diffuse bench demo-quality`: scores of the demo model on held-out prompts
// (bench/demo_quality.h).
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>

#include "bench/demo_quality.h"
#include "commands.h"

namespace diffuse::app {

std::pair<CLI::App*, Command> add_bench_demo_quality(CLI::App& bench) {
  struct Flags {
    bench::DemoQualityOptions opts;
    bool json = false;
  };
  auto f = std::make_shared<Flags>();
  CLI::App* sub = bench.add_subcommand(
      "demo-quality", "Score the demo model's images on held-out prompts (scene scorer)");
  sub->add_option("-m,--model", f->opts.model, "Demo-world model folder")->capture_default_str();
  sub->add_option("--prompts", f->opts.prompts, "Held-out prompts to use")->capture_default_str();
  sub->add_option("--seeds", f->opts.seeds, "Seeds per prompt")->capture_default_str();
  sub->add_option("--steps", f->opts.steps, "Denoising steps")->capture_default_str();
  sub->add_option("--cfg-scale", f->opts.guidance_scale, "Guidance scale")->capture_default_str();
  sub->add_option("--device", f->opts.device, "Device")->capture_default_str();
  sub->add_option("--dtype", f->opts.dtype, "auto|fp32|bf16|fp16")->capture_default_str();
  sub->add_option("--img2img", f->opts.img2img_cases,
                  "Image-to-image cases (blue background -> green)")
      ->capture_default_str();
  sub->add_option("--strength", f->opts.strength, "img2img strength")->capture_default_str();
  sub->add_option("--save", f->opts.save_dir, "Write every image into this folder");
  sub->add_flag("--json", f->json, "Print one JSON object on stdout");
  Command run = [f]() {
    auto opts = f->opts;
    if (!f->json) opts.log = [](const std::string& line) { std::cerr << line << "\n"; };
    const auto r = bench::run_demo_quality(opts);
    const auto& t = r.txt2img;
    const auto& i = r.img2img;
    if (f->json) {
      nlohmann::json rows = nlohmann::json::array();
      for (const auto& row : r.rows) {
        nlohmann::json objs = nlohmann::json::array();
        for (const auto& o : row.score.objects)
          objs.push_back({{"colour_position", o.colour_position},
                          {"shape", o.shape},
                          {"detected_shape", o.detected_shape}});
        rows.push_back({{"prompt", row.prompt},
                        {"seed", row.seed},
                        {"background", row.score.background},
                        {"detected_background", row.score.detected_background},
                        {"objects", objs}});
      }
      std::cout << nlohmann::json{{"model", opts.model},
                                  {"images", t.images},
                                  {"background_accuracy", t.background_accuracy()},
                                  {"colour_position_accuracy", t.colour_position_accuracy()},
                                  {"shape_accuracy", t.shape_accuracy()},
                                  {"img2img_cases", i.images},
                                  {"img2img_background_accuracy", i.background_accuracy()},
                                  {"img2img_objects_kept", i.colour_position_accuracy()},
                                  {"seconds", r.seconds},
                                  {"rows", rows}}
                       .dump(2)
                << "\n";
      return 0;
    }
    std::printf("txt2img: %d images (%d prompts x %d seeds), %d objects\n", t.images, opts.prompts,
                opts.seeds, t.objects);
    std::printf("  background        %5.1f %%\n", 100 * t.background_accuracy());
    std::printf("  colour + position %5.1f %%\n", 100 * t.colour_position_accuracy());
    std::printf("  shape             %5.1f %%\n", 100 * t.shape_accuracy());
    if (i.images > 0) {
      std::printf("img2img (blue -> green background, strength %.2f): %d images\n", opts.strength,
                  i.images);
      std::printf("  new background    %5.1f %%\n", 100 * i.background_accuracy());
      std::printf("  objects kept      %5.1f %% (colour + position)\n",
                  100 * i.colour_position_accuracy());
      std::printf("  shapes kept       %5.1f %%\n", 100 * i.shape_accuracy());
    }
    std::printf("%.1f s\n", r.seconds);
    return 0;
  };
  return {sub, run};
}

}  // namespace diffuse::app
