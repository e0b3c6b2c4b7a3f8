// Replays a reference pipeline run: same prompts, same scheduler config, same initial latents
// or recorded noise, then compares every recorded tensor (final image, latents, embeddings,
// per-step intermediates). Runs from the diffusers folder and, when the set has one, from the
// single-file checkpoint too.
#include <torch/torch.h>

#include <deque>

#include "device/device.h"
#include "io/model_folder.h"
#include "pipeline/stable_diffusion.h"
#include "verify/pipeline_replay.h"
#include "verify/runners.h"

namespace diffuse::verify {
namespace {

bool is_integer(const torch::Tensor& t) {
  return !t.is_floating_point();
}

// Tensors whose scale is O(1) are compared with the plain atol; latent-like tensors grow
// large with random weights and use latents_rtol relative to their largest magnitude.
bool uses_absolute_tolerance(const std::string& name) {
  static const char* kAbsolute[] = {
      "image",          "prompt_embeds", "negative_prompt_embeds", "image_preprocessed",
      "posterior_mean", "posterior_std"};
  for (const char* a : kAbsolute)
    if (name == a) return true;
  // Text embeddings of any encoder (HiDream: prompt_embeds_t5, pooled_prompt_embeds, ...).
  return name.find("embeds") != std::string::npos;
}

// Returns the final image of the run.
torch::Tensor run_one(const GoldenSet& set, const GoldenCase& c, const VerifyOptions& o,
                      const std::string& model_path, const std::string& label, CaseResult* r) {
  CaseTensors t(c);
  LoadOptions lo;
  lo.device = device::device_name(o.device);
  lo.dtype = "fp32";
  lo.vae_dtype = "fp32";
  PipelineReplay replay = replay_pipeline_case(set, c, model_path, lo);
  const auto& traced = replay.traced;
  if (!replay.all_noise_used)
    r->add(label + "noise consumed", Comparison{false, 0, "not all supplied noise was used", {}});
  compare_traced_tensors(c, t, traced, label, r);
  if (!t.has("image") || !traced.count("image")) return torch::Tensor();
  return traced.at("image");
}

// Names golden sets give the same traced tensor: diffusers' SDXL script records the UNet's raw
// output as unet_out and each CLIP encoder's ids by the encoder's name.
void add_aliases(std::map<std::string, torch::Tensor>* traced) {
  static const std::pair<const char*, const char*> kAliases[] = {
      {"text_input_ids", "clip_l_input_ids"},
      {"negative_text_input_ids", "negative_clip_l_input_ids"},
      {"text_input_ids_2", "clip_g_input_ids"},
      {"negative_text_input_ids_2", "negative_clip_g_input_ids"}};
  std::map<std::string, torch::Tensor> extra;
  for (const auto& [name, t] : *traced) {
    for (const auto& [ours, theirs] : kAliases)
      if (name == ours) extra[theirs] = t;
    const std::string raw = ".noise_pred_raw";
    if (name.size() > raw.size() && name.compare(name.size() - raw.size(), raw.size(), raw) == 0)
      extra[name.substr(0, name.size() - raw.size()) + ".unet_out"] = t;
  }
  traced->insert(extra.begin(), extra.end());
}

// The source image of an img2img case: init_image [B, 3, H, W] in [0, 1], or image_uint8
// [H, W, 3] as the reference pipeline got it (a PIL image).
torch::Tensor init_image(const CaseTensors& t) {
  if (t.has("init_image")) return t.get("init_image");
  const auto u8 = t.get("image_uint8");
  if (u8.dim() != 3 || u8.size(2) != 3)
    throw FormatError("image_uint8 must be [H, W, 3], got " + c10::str(u8.sizes()));
  return u8.permute({2, 0, 1}).unsqueeze(0).to(torch::kFloat32) / 255;
}

}  // namespace

void compare_traced_tensors(const GoldenCase& c, const CaseTensors& t,
                            const std::map<std::string, torch::Tensor>& traced,
                            const std::string& label, CaseResult* r) {
  double atol = c.tol("atol", 1e-4);
  double latents_rtol = c.tol("latents_rtol", c.tol("rtol", 1e-5));
  for (const auto& [name, got] : traced) {
    if (!t.has(name)) continue;
    auto expected = t.get(name);
    const bool u8_image = name.size() > 3 && name.compare(name.size() - 3, 3, "_u8") == 0;
    if (u8_image && c.tolerance.contains("image_u8_atol")) {
      // Pillow's 8-bit resizes and composites, after a float decode: within a level or so.
      r->add(label + name, compare(label + name, got.to(torch::kFloat32),
                                   expected.to(torch::kFloat32), c.tol("image_u8_atol", 0), 0));
    } else if (is_integer(expected)) {
      r->add(label + name, compare_exact(label + name, got, expected));
    } else if ((name.size() >= 2 && name.compare(name.size() - 2, 2, ".t") == 0) ||
               name.find("unet_timestep") != std::string::npos) {
      r->add(label + name, compare(label + name, got, expected, 1e-4, 0));
    } else if (uses_absolute_tolerance(name)) {
      r->add(label + name, compare(label + name, got, expected, atol, 0));
    } else {
      double scale = expected.abs().max().item<double>();
      r->add(label + name,
             compare(label + name, got, expected, std::max(atol, latents_rtol * scale), 0));
    }
  }
  // The final picture: `image` (float), or only its 8-bit form where the reference ran PIL
  // on it (image_out_u8).
  const char* final_name = t.has("image") || !t.has("image_out_u8") ? "image" : "image_out_u8";
  if (!t.has(final_name) || !traced.count(final_name))
    r->add(label + final_name, Comparison{false, 0, "no final image to compare", {}});
}

PipelineReplay replay_pipeline_case(const GoldenSet& set, const GoldenCase& c,
                                    const std::string& model_path, LoadOptions lo) {
  CaseTensors t(c);
  if (model_path != set.model_dir(c)) lo.config_dir = set.model_dir(c);
  pipeline::StableDiffusion sd(model_path, lo);
  if (c.params.contains("scheduler"))
    sd.set_scheduler_config(c.param("scheduler", nlohmann::json()));
  PipelineReplay replay;
  sd.set_trace([&](const std::string& name, const torch::Tensor& v) {
    replay.traced[name] = v.detach().to(torch::kCPU).clone();
  });

  GenerationConfig g;
  g.prompts = c.param_strings("prompt");
  g.negative_prompts = c.param_strings("negative_prompt");
  g.guidance_scale = c.param("guidance_scale", 7.5);
  g.steps = c.param("num_inference_steps", 50);
  g.images_per_prompt = c.param("num_images_per_prompt", 1);
  g.seed = 0;
  if (c.params.contains("eta")) g.eta = c.param("eta", 0.0);
  auto& size = g.size_conditioning;
  size.aesthetic_score = c.param("aesthetic_score", size.aesthetic_score);
  size.negative_aesthetic_score =
      c.param("negative_aesthetic_score", size.negative_aesthetic_score);
  // ControlNets: control_image_u8.j with params.controlnet_dirs[j], one scale for all or one
  // each, the guidance window and guess mode.
  for (size_t j = 0; t.has("control_image_u8." + std::to_string(j)); ++j) {
    ControlNetUnit u;
    u.model = case_controlnet_dir(set, c, j);
    u.image = t.get("control_image_u8." + std::to_string(j));
    const auto scales = c.params.contains("controlnet_conditioning_scale")
                            ? c.params.at("controlnet_conditioning_scale")
                            : nlohmann::json(1.0);
    u.scale = scales.is_array() ? scales.at(j).get<double>() : scales.get<double>();
    u.start = c.param("control_guidance_start", 0.0);
    u.end = c.param("control_guidance_end", 1.0);
    g.controlnets.push_back(std::move(u));
  }
  g.guess_mode = c.param("guess_mode", false);
  // Recorded randomness in the order the reference drew it (params.noise_draw_order).
  std::deque<torch::Tensor> drawn;
  if (c.params.contains("noise_draw_order"))
    for (const auto& d : c.params.at("noise_draw_order"))
      drawn.push_back(t.get(d.at("name").get<std::string>()));
  if (t.has("mask_u8")) {
    const auto image = t.get("image_u8");
    g.inpaint.mask = t.get("mask_u8");
    g.inpaint.crop_padding = c.param("padding_mask_crop", -1);
    g.strength = c.param("strength", 1.0);
    g.height = c.param("height", 0);
    g.width = c.param("width", 0);
    sd.set_noise_source([&drawn](c10::IntArrayRef shape) {
      if (drawn.empty())
        throw FormatError("the case supplies fewer noise tensors than the pipeline draws");
      auto v = drawn.front();
      drawn.pop_front();
      return v;
    });
    replay.result =
        sd.image2image(g, image.permute({2, 0, 1}).unsqueeze(0).to(torch::kFloat32) / 255, {});
    replay.all_noise_used = drawn.empty();
  } else if (t.has("init_image") || t.has("image_uint8")) {
    g.strength = c.param("strength", 0.8);
    // Recorded randomness in draw order: the VAE posterior sample, then add_noise's noise.
    std::deque<torch::Tensor> noise;
    for (const char* n : {"posterior_noise", "noise", "noise.vae_sample", "noise.img2img"})
      if (t.has(n)) noise.push_back(t.get(n));
    sd.set_noise_source([&noise](c10::IntArrayRef shape) {
      if (noise.empty())
        throw FormatError("the case supplies fewer noise tensors than the pipeline draws");
      auto v = noise.front();
      noise.pop_front();
      return v;
    });
    replay.result = sd.image2image(g, init_image(t), {});
    replay.all_noise_used = noise.empty();
  } else {
    g.height = c.param("height", 0);
    g.width = c.param("width", 0);
    g.latents = t.has("latents") ? t.get("latents") : t.get("noise_initial");
    replay.result = sd.text2image(g, {});
  }
  add_aliases(&replay.traced);
  return replay;
}

CaseResult verify_pipeline(const GoldenSet& set, const GoldenCase& c, const VerifyOptions& o) {
  const auto cls =
      io::ModelFolder::open(set.model_dir(c)).model_index().get<std::string>("_class_name", "");
  if (cls.rfind("HiDream", 0) == 0) return verify_hidream_pipeline(set, c, o);
  if (cls.rfind("Flux", 0) == 0) return verify_flux_pipeline(set, c, o);
  CaseResult r;
  auto folder_image = run_one(set, c, o, set.model_dir(c), "", &r);
  std::string single = set.single_file_checkpoint();
  if (!single.empty()) {
    auto single_image = run_one(set, c, o, single, "single-file:", &r);
    // Same weights in two layouts: the images must be identical, not just close.
    if (folder_image.defined() && single_image.defined())
      r.add("single-file == folder",
            compare("single-file image vs folder image", single_image, folder_image, 0, 0));
  }
  return r;
}

}  // namespace diffuse::verify
