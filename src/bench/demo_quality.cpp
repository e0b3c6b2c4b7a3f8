#include "bench/demo_quality.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <random>

#include <torch/torch.h>

#include "diffuse/pipeline.h"
#include "train/scene.h"

namespace diffuse::bench {
namespace {

std::string image_name(const std::string& kind, size_t index, uint64_t seed) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%s-%03zu-seed%llu.png", kind.c_str(), index,
                static_cast<unsigned long long>(seed));
  return buf;
}

}  // namespace

DemoQualityResult run_demo_quality(const DemoQualityOptions& o) {
  if (o.prompts < 1 || o.seeds < 1 || o.steps < 1 || o.img2img_cases < 0 || o.inpaint_cases < 0)
    throw InvalidArgument("bench demo-quality: prompts, seeds and steps must be >= 1");
  const auto t0 = std::chrono::steady_clock::now();
  LoadOptions lo;
  lo.device = o.device;
  lo.dtype = o.dtype;
  lo.vae_dtype = o.dtype;
  lo.weights = o.weights;
  auto txt2img = Text2Image::load(o.model, lo);
  if (!o.save_dir.empty()) std::filesystem::create_directories(o.save_dir);
  DemoQualityResult result;

  const auto prompts = train::held_out_prompts(o.prompts);
  for (size_t i = 0; i < prompts.size(); ++i) {
    const auto spec = train::parse_caption(prompts[i]);
    for (int s = 0; s < o.seeds; ++s) {
      GenerationConfig cfg;
      cfg.prompts = {prompts[i]};
      cfg.steps = o.steps;
      cfg.guidance_scale = o.guidance_scale;
      cfg.seed = static_cast<uint64_t>(s);
      auto out = txt2img.generate(cfg);
      DemoQualityRow row{prompts[i], static_cast<uint64_t>(s),
                         train::score_scene(out.images[0], *spec)};
      result.txt2img.add(row.score);
      if (!o.save_dir.empty())
        write_png((std::filesystem::path(o.save_dir) / image_name("txt2img", i, s)).string(),
                  out.images[0], {{"prompt", prompts[i]}});
      result.rows.push_back(std::move(row));
    }
    if (o.log)
      o.log("prompt " + std::to_string(i + 1) + "/" + std::to_string(prompts.size()) +
            ": background " + std::to_string(result.txt2img.background_ok) + "/" +
            std::to_string(result.txt2img.images) + ", colour+position " +
            std::to_string(result.txt2img.colour_position_ok) + "/" +
            std::to_string(result.txt2img.objects));
  }

  if (o.img2img_cases > 0) {
    auto img2img = Image2Image::load(o.model, lo);
    std::mt19937_64 rng(0x12A612A6ull);
    for (int i = 0; i < o.img2img_cases; ++i) {
      // A scene without green or blue objects, rendered on blue; the prompt asks for green.
      train::Scene scene;
      do {
        scene = train::sample_scene(rng);
      } while ([&] {
        for (const auto& ob : scene.objects)
          if (ob.colour == train::Colour::kGreen || ob.colour == train::Colour::kBlue) return true;
        return false;
      }());
      scene.background = train::Colour::kBlue;
      const int res = txt2img.info().default_width > 0 ? txt2img.info().default_width : 128;
      const Image init = train::render_scene(scene, res, res);
      auto spec = train::spec_of(scene, false);
      spec.background = train::Colour::kGreen;
      GenerationConfig cfg;
      cfg.prompts = {train::caption(spec)};
      cfg.steps = o.steps;
      cfg.guidance_scale = o.guidance_scale;
      cfg.strength = o.strength;
      cfg.seed = static_cast<uint64_t>(i);
      auto out = img2img.generate(cfg, init);
      auto score = train::score_scene(out.images[0], spec);
      result.img2img.add(score);
      if (!o.save_dir.empty()) {
        write_png((std::filesystem::path(o.save_dir) / image_name("img2img-in", i, i)).string(),
                  init);
        write_png((std::filesystem::path(o.save_dir) / image_name("img2img-out", i, i)).string(),
                  out.images[0], {{"prompt", cfg.prompts[0]}});
      }
    }
    if (o.log)
      o.log("img2img: background " + std::to_string(result.img2img.background_ok) + "/" +
            std::to_string(result.img2img.images) + ", objects kept " +
            std::to_string(result.img2img.colour_position_ok) + "/" +
            std::to_string(result.img2img.objects));
  }
  if (o.inpaint_cases > 0) {
    auto inpaint = Image2Image::load(o.model, lo);
    std::mt19937_64 rng(0x1F9A1F7ull);
    const int res = txt2img.info().default_width > 0 ? txt2img.info().default_width : 128;
    double kept_change = 0;
    for (int i = 0; i < o.inpaint_cases; ++i) {
      // Two objects, one in each half; the right one becomes another colour and shape.
      train::Scene scene;
      size_t right = 0;
      do {
        scene = train::sample_scene(rng);
        right =
            scene.objects.size() == 2 && scene.objects[1].region == train::Region::kRight ? 1 : 0;
      } while (scene.objects.size() != 2 || scene.objects[right].region != train::Region::kRight ||
               scene.objects[1 - right].region != train::Region::kLeft);
      train::Scene wanted = scene;
      auto& target = wanted.objects[right];
      const auto& kept = scene.objects[1 - right];
      do {
        target.colour = static_cast<train::Colour>(rng() % train::kNumColours);
        target.shape = static_cast<train::Shape>(rng() % train::kNumShapes);
      } while (target.colour == scene.background || target.colour == kept.colour ||
               target.colour == scene.objects[right].colour);
      const Image source = train::render_scene(scene, res, res);
      auto mask = torch::zeros({res, res}, torch::kUInt8);
      mask.slice(1, res / 2, res).fill_(255);
      const auto spec = train::spec_of(wanted, false);
      GenerationConfig cfg;
      cfg.prompts = {train::caption(spec)};
      cfg.steps = o.steps;
      cfg.guidance_scale = o.guidance_scale;
      cfg.strength = 1.0;
      cfg.seed = static_cast<uint64_t>(i);
      cfg.inpaint.mask = mask;
      auto out = inpaint.generate(cfg, source);
      const auto score = train::score_scene(out.images[0], spec);
      result.inpaint.add(score);
      result.inpaint_fully_right += score.all() ? 1 : 0;
      // How far the kept half moved (the VAE's round trip is what it may cost).
      double sum = 0;
      int64_t n = 0;
      for (int y = 0; y < res; ++y)
        for (int x = 0; x < res / 2; ++x)
          for (int c = 0; c < 3; ++c) {
            const size_t k = (static_cast<size_t>(y) * res + x) * 3 + c;
            sum += std::abs(int(out.images[0].rgb[k]) - int(source.rgb[k]));
            ++n;
          }
      kept_change += sum / static_cast<double>(n);
      if (!o.save_dir.empty()) {
        write_png((std::filesystem::path(o.save_dir) / image_name("inpaint-in", i, i)).string(),
                  source);
        write_png((std::filesystem::path(o.save_dir) / image_name("inpaint-out", i, i)).string(),
                  out.images[0], {{"prompt", cfg.prompts[0]}});
      }
    }
    result.inpaint_kept_change = kept_change / o.inpaint_cases;
    if (o.log)
      o.log("inpaint: fully right " + std::to_string(result.inpaint_fully_right) + "/" +
            std::to_string(result.inpaint.images) + ", objects " +
            std::to_string(result.inpaint.colour_position_ok) + "/" +
            std::to_string(result.inpaint.objects));
  }
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return result;
}

}  // namespace diffuse::bench
