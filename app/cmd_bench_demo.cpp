// `diffuse bench demo-quality`: scores of the demo model on held-out prompts
// (bench/demo_quality.h).
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>

#include "bench/demo_edit_quality.h"
#include "bench/demo_quality.h"
#include "commands.h"

namespace diffuse::app {
namespace {

void print_tally(const char* name, const bench::EditTally& t) {
  std::printf(
      "  %-12s %3d images  fully right %5.1f %%  objects right %5.1f %%  background %5.1f %%\n",
      name, t.scores.images, 100 * t.fully_right_rate(), 100 * t.objects_right_rate(),
      100 * t.scores.background_accuracy());
}

nlohmann::json tally_json(const bench::EditTally& t) {
  return {{"images", t.scores.images},
          {"fully_right", t.fully_right_rate()},
          {"objects_right", t.objects_right_rate()},
          {"background", t.scores.background_accuracy()},
          {"colour_position", t.scores.colour_position_accuracy()},
          {"shape", t.scores.shape_accuracy()}};
}

template <typename Flags>
int run_edit_quality(const Flags& f) {
  auto o = f.edit_opts;
  // The shared flags, where the user gave them (their defaults are the SD demo's).
  if (f.opts.model != bench::DemoQualityOptions{}.model) o.model = f.opts.model;
  o.prompts = f.opts.prompts;
  o.seeds = f.opts.seeds == bench::DemoQualityOptions{}.seeds ? o.seeds : f.opts.seeds;
  o.steps = f.opts.steps == bench::DemoQualityOptions{}.steps ? 0 : f.opts.steps;
  o.guidance_scale = f.opts.guidance_scale == bench::DemoQualityOptions{}.guidance_scale
                         ? -1
                         : f.opts.guidance_scale;
  o.device = f.opts.device;
  o.dtype = f.opts.dtype;
  o.weights = f.opts.weights;
  o.save_dir = f.opts.save_dir;
  if (!f.json) o.log = [](const std::string& line) { std::cerr << line << "\n"; };
  const auto r = bench::run_demo_edit_quality(o);
  if (f.json) {
    nlohmann::json kinds = nlohmann::json::object();
    for (const auto& [k, t] : r.kinds) kinds[k] = tally_json(t);
    std::cout << nlohmann::json{{"model", o.model},
                                {"steps", r.steps},
                                {"guidance_scale", r.guidance_scale},
                                {"image_guidance_scale", r.image_guidance_scale},
                                {"edits", tally_json(r.edits)},
                                {"unedited", tally_json(r.unedited)},
                                {"autoencoder", tally_json(r.autoencoder)},
                                {"kinds", kinds},
                                {"txt2img", tally_json(r.txt2img)},
                                {"seconds", r.seconds}}
                     .dump(2)
              << "\n";
    return 0;
  }
  std::printf("%s: %d steps, guidance %.2f, image guidance %.2f\n", o.model.c_str(), r.steps,
              r.guidance_scale, r.image_guidance_scale);
  std::printf(
      "edits (%d held-out x %d seeds), scored against the scene the instruction asks for:\n",
      o.edits, o.seeds);
  print_tally("edited", r.edits);
  print_tally("unedited", r.unedited);
  std::printf("sources through the VAE and back, scored against themselves (the ceiling):\n");
  print_tally("autoencoder", r.autoencoder);
  for (const auto& [k, t] : r.kinds) print_tally(k.c_str(), t);
  if (r.txt2img.scores.images > 0) {
    std::printf("txt2img (%d held-out prompts x %d seeds):\n", o.prompts, o.seeds);
    print_tally("txt2img", r.txt2img);
    std::printf("  colour + position %5.1f %%, shape %5.1f %%\n",
                100 * r.txt2img.scores.colour_position_accuracy(),
                100 * r.txt2img.scores.shape_accuracy());
  }
  std::printf("%.1f s\n", r.seconds);
  return 0;
}

}  // namespace

std::pair<CLI::App*, Command> add_bench_demo_quality(CLI::App& bench) {
  struct Flags {
    bench::DemoQualityOptions opts;
    bench::DemoEditQualityOptions edit_opts;
    bool edit = false;
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
  sub->add_option("--weights", f->opts.weights,
                  "none|q8_0|q4_0|int8: the denoiser's linear weights (a UNet's and VAE's "
                  "convolutions too) kept quantized (as txt2img --weights)")
      ->capture_default_str();
  sub->add_option("--img2img", f->opts.img2img_cases,
                  "Image-to-image cases (blue background -> green)")
      ->capture_default_str();
  sub->add_option("--strength", f->opts.strength, "img2img strength")->capture_default_str();
  sub->add_option("--inpaint", f->opts.inpaint_cases,
                  "Inpainting cases: the right half of a two-object scene masked, the prompt "
                  "naming another object there")
      ->capture_default_str();
  sub->add_option("--save", f->opts.save_dir, "Write every image into this folder");
  sub->add_flag("--json", f->json, "Print one JSON object on stdout");
  sub->add_flag("--edit", f->edit,
                "Score a HiDream-architecture demo model (default models/demo-edit): held-out "
                "instruction edits, and text-to-image on held-out prompts");
  sub->add_option("--edits", f->edit_opts.edits, "With --edit: held-out edits to run")
      ->capture_default_str();
  sub->add_option("--image-guidance", f->edit_opts.image_guidance_scale,
                  "With --edit: image guidance scale (default: the model folder's)");
  Command run = [f]() {
    if (f->edit) return run_edit_quality(*f);
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
                                  {"inpaint_cases", r.inpaint.images},
                                  {"inpaint_fully_right",
                                   r.inpaint.images
                                       ? double(r.inpaint_fully_right) / r.inpaint.images
                                       : 0.0},
                                  {"inpaint_objects_right", r.inpaint.colour_position_accuracy()},
                                  {"inpaint_shapes_right", r.inpaint.shape_accuracy()},
                                  {"inpaint_kept_change", r.inpaint_kept_change},
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
    if (r.inpaint.images > 0) {
      std::printf("inpaint (right half masked, another object asked there): %d images\n",
                  r.inpaint.images);
      std::printf("  fully right       %5.1f %%\n",
                  100.0 * r.inpaint_fully_right / r.inpaint.images);
      std::printf("  objects right     %5.1f %% (colour + position), shapes %5.1f %%\n",
                  100 * r.inpaint.colour_position_accuracy(), 100 * r.inpaint.shape_accuracy());
      std::printf("  kept half changed %5.2f / 255 on average\n", r.inpaint_kept_change);
    }
    std::printf("%.1f s\n", r.seconds);
    return 0;
  };
  return {sub, run};
}

}  // namespace diffuse::app
