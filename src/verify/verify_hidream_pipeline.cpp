// Replays a HiDream reference pipeline run (text-to-image, or E1 editing when the case has a
// source image) from its stored prompts, scheduler config, initial latents and recorded
// noise, and compares every recorded tensor: the ids fed to the four tokenizers, the
// embeddings, each step's transformer input/timesteps/raw output and latents, the final
// latents and image.
#include <torch/torch.h>

#include <map>

#include "io/json_config.h"
#include "io/model_folder.h"
#include "pipeline/hidream.h"
#include "verify/runners.h"

namespace diffuse::verify {
namespace {

using Traced = std::map<std::string, torch::Tensor>;

void trace_embeddings(Traced& out, const std::string& prefix,
                      const pipeline::HiDreamEmbeddings& e) {
  if (!e.pooled.defined()) return;
  const std::string p = prefix.empty() ? "" : prefix + "_";
  out[p + "prompt_embeds_t5"] = e.t5;
  out[p + "prompt_embeds_llama3"] = e.llama;
  out[p + "pooled_prompt_embeds"] = e.pooled;
}

void trace_ids(Traced& out, const std::string& prefix, const pipeline::HiDreamEmbeddings& e) {
  if (!e.pooled.defined()) return;
  const std::string p = prefix.empty() ? "" : prefix + "_";
  out[p + "clip_l_input_ids"] = pipeline::token_ids_tensor(e.clip_l_ids);
  out[p + "clip_g_input_ids"] = pipeline::token_ids_tensor(e.clip_g_ids);
  out[p + "t5_input_ids"] = pipeline::token_ids_tensor(e.t5_ids);
  out[p + "t5_attention_mask"] = pipeline::token_mask_tensor(e.t5_ids);
  out[p + "llama_input_ids"] = pipeline::token_ids_tensor(e.llama_ids);
  out[p + "llama_attention_mask"] = pipeline::token_mask_tensor(e.llama_ids);
}

// The replay runs one prompt: a list of several would be silently cut to its first.
std::string one_prompt(const GoldenCase& c, const std::string& key) {
  const auto prompts = c.param_strings(key);
  if (prompts.size() > 1) c.bad_param(key, "one prompt (the HiDream replay runs batch 1)");
  return prompts.empty() ? "" : prompts[0];
}

}  // namespace

CaseResult verify_hidream_pipeline(const GoldenSet& set, const GoldenCase& c,
                                   const VerifyOptions& o) {
  CaseTensors t(c);
  auto folder = io::ModelFolder::open(set.model_dir());
  const bool editing = t.has("image_uint8");
  // E1 editing runs on the E1 weights: with a refine phase as I1 + the set's peft LoRA file
  // (E1-Full, whose refine steps need the exact I1 weights), else the merged E1 folder when the
  // set has one.
  const double refine = c.param("refine_strength", 0.0);
  const auto lora = set.index.value("e1_weights", nlohmann::json::object());
  const bool use_lora = editing && refine > 0 && lora.contains("lora_file");
  std::string component = "transformer";
  if (editing && !use_lora && folder.has_component("transformer_e1")) component = "transformer_e1";
  pipeline::HiDreamPipeline pipe(folder, o.device, torch::kFloat32, component);
  if (use_lora) {
    adapters::LoraOptions lo;
    if (lora.contains("lora_alpha")) lo.alpha = lora["lora_alpha"].get<double>();
    if (lora.contains("lora_rank")) lo.rank = lora["lora_rank"].get<double>();
    pipe.set_editing_lora(
        set.path_inside(lora["lora_file"].get<std::string>(), "e1_weights.lora_file"), lo);
  }
  pipe.set_sequence_group(o.sequence_group);
  pipe.set_cfg_group(o.cfg_group);
  if (c.params.contains("scheduler"))
    pipe.set_scheduler(schedulers::make_scheduler(
        io::JsonConfig(c.param("scheduler", nlohmann::json()), c.where + ": params.scheduler")));

  Traced traced;
  pipeline::HiDreamSampling s;
  s.steps = c.param("num_inference_steps", 50);
  s.guidance_scale = c.param("guidance_scale", 5.0);
  s.max_sequence_length = c.param("max_sequence_length", int64_t{128});
  s.latents = t.get("latents");
  for (int i = 0; t.has("noise." + std::to_string(i)); ++i)
    s.step_noise.push_back(t.get("noise." + std::to_string(i)));
  s.on_step = [&](const pipeline::HiDreamStep& st) {
    const std::string k = "step." + std::to_string(st.index) + ".";
    traced[k + "t"] = st.t.to(torch::kCPU, torch::kFloat32);
    traced[k + "transformer_input"] = st.transformer_input.to(torch::kCPU).clone();
    traced[k + "transformer_timesteps"] = st.transformer_timesteps.to(torch::kCPU).clone();
    traced[k + "transformer_out"] = st.transformer_out.to(torch::kCPU).clone();
    traced[k + "latents"] = st.latents.to(torch::kCPU).clone();
    return true;
  };

  pipeline::HiDreamResult result;
  if (editing) {
    pipeline::HiDreamEdit e;
    e.prompt = one_prompt(c, "prompt");
    e.negative_prompt = one_prompt(c, "negative_prompt");
    e.image = t.get("image_uint8");
    e.image_guidance_scale = c.param("image_guidance_scale", 4.0);
    e.clip_cfg_norm = c.param("clip_cfg_norm", true);
    e.refine_strength = refine;
    e.target_prompt = one_prompt(c, "target_prompt");
    e.sampling = s;
    result = pipe.edit(e);
    traced["image_latents"] = result.image_latents.to(torch::kCPU);
  } else {
    pipeline::HiDreamTextToImage r;
    r.prompt = one_prompt(c, "prompt");
    r.negative_prompt = one_prompt(c, "negative_prompt");
    r.height = c.param("height", 1024);
    r.width = c.param("width", 1024);
    r.area_side = c.param("default_sample_size", 128) * c.param("vae_scale_factor", 8);
    r.sampling = s;
    result = pipe.text_to_image(r);
  }
  trace_embeddings(traced, "", result.prompt_embeddings);
  trace_embeddings(traced, "negative", result.negative_embeddings);
  trace_ids(traced, "", result.prompt_embeddings);
  trace_ids(traced, "negative", result.negative_embeddings);
  trace_embeddings(traced, "target", result.target_embeddings);
  trace_ids(traced, "target", result.target_embeddings);
  // The refine phase encodes the negative prompt again for its own batch (same ids).
  if (result.target_embeddings.pooled.defined())
    trace_embeddings(traced, "target_negative", result.negative_embeddings);
  traced["latents_out"] = result.latents;
  traced["image"] = result.image;

  CaseResult r;
  compare_traced_tensors(c, t, traced, "", &r);
  return r;
}

}  // namespace diffuse::verify
