#include "bench/demo_edit_quality.h"

#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <filesystem>

#include "device/device.h"
#include "diffuse/errors.h"
#include "diffuse/image.h"
#include "io/model_folder.h"
#include "pipeline/hidream.h"
#include "pipeline/hidream_variant.h"
#include "pipeline/stable_diffusion.h"
#include "train/scene_edit.h"

namespace fs = std::filesystem;

namespace diffuse::bench {
namespace {

Image to_image(const torch::Tensor& nhwc) {
  return pipeline::to_images(nhwc)[0];
}

torch::Tensor as_tensor(const Image& img) {
  return torch::from_blob(const_cast<uint8_t*>(img.rgb.data()), {img.height, img.width, 3},
                          torch::kUInt8)
      .clone();
}

std::string edit_file_name(const char* kind, size_t index, int seed) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%s-%03zu-seed%d.png", kind, index, seed);
  return buf;
}

void add_run(DemoEditQualityResult& r, const pipeline::HiDreamResult& run, bool keep) {
  r.denoise_s += run.timings.denoise_s;
  r.cache += run.cache;
  if (keep) r.images.push_back(run.image);
}

// The source through the VAE and back (the posterior's mean): the best any latent the transformer
// draws can score, so that a poor edit score can be told apart from a poor autoencoder.
Image vae_round_trip(pipeline::HiDreamPipeline& pipe, const Image& img) {
  torch::NoGradGuard no_grad;
  auto& vae = pipe.vae();
  const auto x = as_tensor(img).permute({2, 0, 1}).unsqueeze(0).to(torch::kFloat32) / 127.5 - 1;
  const auto z = vae->encode(x.to(pipe.vae_device())).mean;
  const auto y = vae->decode(z).to(torch::kFloat32).cpu();
  return to_image(((y.clamp(-1, 1) + 1) / 2).permute({0, 2, 3, 1}));
}

}  // namespace

void EditTally::add(const train::SceneScore& s) {
  scores.add(s);
  fully_right += s.all() ? 1 : 0;
  for (const auto& o : s.objects) objects_right += o.colour_position && o.shape ? 1 : 0;
}

DemoEditQualityResult run_demo_edit_quality(const DemoEditQualityOptions& o) {
  const auto folder = io::ModelFolder::open(o.model);
  const auto defaults = pipeline::hidream_defaults(folder);
  const auto device = device::resolve_device(o.device);
  const auto dtype = device::resolve_dtype(o.dtype, device, "transformer");
  pipeline::HiDreamPipeline pipe(folder, device, dtype);
  pipe.set_weight_type(o.weights);
  return run_demo_edit_quality(pipe, defaults, o);
}

DemoEditQualityResult run_demo_edit_quality(pipeline::HiDreamPipeline& pipe,
                                            const pipeline::HiDreamDefaults& defaults,
                                            const DemoEditQualityOptions& o) {
  if (o.edits < 0 || o.prompts < 0 || o.seeds < 1 || (o.edits == 0 && o.prompts == 0))
    throw InvalidArgument(
        "bench demo-quality --edit: --edits and --prompts must be >= 0 (not both 0), --seeds >= "
        "1");
  const auto t0 = std::chrono::steady_clock::now();
  DemoEditQualityResult r;
  r.steps = o.steps > 0 ? o.steps : defaults.steps;
  r.guidance_scale = o.guidance_scale >= 0 ? o.guidance_scale : defaults.guidance_scale;
  r.image_guidance_scale =
      o.image_guidance_scale >= 0 ? o.image_guidance_scale : defaults.image_guidance_scale;
  if (!o.save_dir.empty()) fs::create_directories(o.save_dir);
  const int side = pipe.area_side();
  auto sampling = [&](int seed) {
    pipeline::HiDreamSampling s;
    s.steps = r.steps;
    s.guidance_scale = r.guidance_scale;
    s.seed = static_cast<uint64_t>(seed);
    s.cache = o.cache;
    return s;
  };

  const auto edits = train::held_out_edits(o.edits);
  for (size_t i = 0; i < edits.size(); ++i) {
    const auto& e = edits[i];
    const auto target = train::spec_of(e.target, false);
    const Image source = train::render_scene(e.source, side, side);
    r.unedited.add(train::score_scene(source, target));
    r.autoencoder.add(
        train::score_scene(vae_round_trip(pipe, source), train::spec_of(e.source, false)));
    for (int seed = 0; seed < o.seeds; ++seed) {
      pipeline::HiDreamEdit req;
      req.prompt = train::e1_prompt(e.instruction, train::caption(target));
      req.image = as_tensor(source);
      req.image_guidance_scale = r.image_guidance_scale;
      req.sampling = sampling(seed);
      const auto run = pipe.edit(req);
      add_run(r, run, o.keep_images);
      const Image result = to_image(run.image);
      const auto score = train::score_scene(result, target);
      r.edits.add(score);
      r.kinds[train::edit_kind_name(e.kind)].add(score);
      if (!o.save_dir.empty()) {
        if (seed == 0)
          write_png((fs::path(o.save_dir) / edit_file_name("edit-in", i, 0)).string(), source);
        write_png((fs::path(o.save_dir) / edit_file_name("edit-out", i, seed)).string(), result,
                  {{"prompt", req.prompt}});
      }
    }
    if (o.log)
      o.log("edit " + std::to_string(i + 1) + "/" + std::to_string(edits.size()) + " (" +
            train::edit_kind_name(e.kind) + "): fully right " +
            std::to_string(r.edits.fully_right) + "/" + std::to_string(r.edits.scores.images));
  }

  const auto prompts = train::held_out_prompts(o.prompts);
  for (size_t i = 0; i < static_cast<size_t>(o.prompts) && i < prompts.size(); ++i) {
    const auto spec = train::parse_caption(prompts[i]);
    for (int seed = 0; seed < o.seeds; ++seed) {
      pipeline::HiDreamTextToImage req;
      req.prompt = prompts[i];
      req.width = req.height = side;
      req.sampling = sampling(seed);
      const auto run = pipe.text_to_image(req);
      add_run(r, run, o.keep_images);
      const Image result = to_image(run.image);
      r.txt2img.add(train::score_scene(result, *spec));
      if (!o.save_dir.empty())
        write_png((fs::path(o.save_dir) / edit_file_name("txt2img", i, seed)).string(), result,
                  {{"prompt", prompts[i]}});
    }
    if (o.log && (i + 1) % 10 == 0)
      o.log("txt2img " + std::to_string(i + 1) + "/" + std::to_string(o.prompts) + ": background " +
            std::to_string(r.txt2img.scores.background_ok) + "/" +
            std::to_string(r.txt2img.scores.images));
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

}  // namespace diffuse::bench
