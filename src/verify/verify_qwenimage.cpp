// Golden runners of a Qwen-Image set (every component of a set whose model_index.json names a
// QwenImage pipeline comes here): the Qwen2 tokenizer and the pipelines' templates, the Qwen2-VL
// image processor, Qwen2.5-VL (hidden states, mRoPE positions, image embeddings), the causal VAE,
// the transformer, the flow-matching schedule with dynamic exponential shift, and both pipelines
// replayed from their stored inputs. Tolerances come from the case (`tolerance.atol`, or the
// nested `encode` / `decode` / `image` / `latents_final` objects); templates and drop counts are
// the engine's own (pipeline/qwenimage_text.h), checked against what a case states.
#include <torch/torch.h>

#include <filesystem>
#include <map>

#include "diffuse/errors.h"
#include "io/model_folder.h"
#include "models/autoencoder_kl_qwenimage.h"
#include "models/qwen2_5_vl.h"
#include "models/qwenimage_transformer.h"
#include "pipeline/qwen_vl_image_processor.h"
#include "pipeline/qwenimage.h"
#include "pipeline/qwenimage_text.h"
#include "schedulers/flow_match.h"
#include "text/llama_tokenizer.h"
#include "verify/runners.h"

namespace diffuse::verify {
namespace {

// tolerance[group][key] (or tolerance[key] without the group), else `fallback`.
double nested_tol(const GoldenCase& c, const std::string& group, const std::string& key,
                  double fallback) {
  if (c.tolerance.contains(group) && c.tolerance[group].is_object()) {
    const auto& g = c.tolerance[group];
    if (g.contains(key) && g[key].is_number()) return g[key].get<double>();
  }
  return c.tol(key, fallback);
}

torch::Tensor ids_of(const std::vector<int64_t>& v) {
  return torch::tensor(v, torch::kInt64);
}

std::array<int64_t, 3> grid_of(const torch::Tensor& t) {
  const auto g = t.reshape({-1}).to(torch::kInt64);
  if (g.numel() != 3) throw FormatError("image_grid_thw must hold 3 values");
  return {g[0].item<int64_t>(), g[1].item<int64_t>(), g[2].item<int64_t>()};
}

void check_param(CaseResult& r, const GoldenCase& c, const std::string& key, int64_t ours) {
  if (!c.params.contains(key)) return;
  r.add(key, compare_exact(key, torch::tensor(ours), torch::tensor(c.param(key, int64_t{0}))));
}

CaseResult run_tokenizer(const GoldenSet& set, const GoldenCase& c) {
  const auto folder = io::ModelFolder::open(set.model_dir(c));
  pipeline::QwenImageTextEncoder enc(folder, torch::kCPU, torch::kFloat32);
  const auto tok = text::load_qwen2_tokenizer(folder.component_dir("tokenizer"));
  CaseTensors t(c);
  CaseResult r;
  const auto prompts = c.param_strings("prompts");
  check_param(r, c, "t2i_drop_idx", pipeline::qwen_image_template().drop);
  check_param(r, c, "edit_drop_idx", pipeline::qwen_image_edit_template().drop);
  for (size_t i = 0; i < prompts.size(); ++i) {
    const std::string n = std::to_string(i);
    if (t.has("raw_ids_" + n))
      r.add("raw_ids_" + n, compare_exact("raw_ids_" + n, ids_of(tok.encode_ordinary(prompts[i])),
                                          t.get("raw_ids_" + n)));
    if (t.has("t2i_input_ids_" + n)) {
      const auto in = enc.tokenize(prompts[i]);
      r.add("t2i_input_ids_" + n, compare_exact("t2i_input_ids_" + n, in.input_ids.reshape({-1}),
                                                t.get("t2i_input_ids_" + n)));
      if (t.has("t2i_attention_mask_" + n))
        r.add("t2i_attention_mask_" + n,
              compare_exact("t2i_attention_mask_" + n, in.attention_mask.reshape({-1}),
                            t.get("t2i_attention_mask_" + n)));
    }
  }
  if (t.has("t2i_prefix_ids")) {
    const auto ids = enc.tokenize("").input_ids.reshape({-1});
    r.add("t2i_prefix_ids",
          compare_exact("t2i_prefix_ids", ids.narrow(0, 0, pipeline::qwen_image_template().drop),
                        t.get("t2i_prefix_ids")));
  }
  if (t.has("edit_input_ids") && t.has("edit_image_uint8")) {
    const auto in =
        enc.tokenize_edit(c.param("edit_prompt", std::string()), t.get("edit_image_uint8"));
    r.add("edit_input_ids",
          compare_exact("edit_input_ids", in.input_ids.reshape({-1}), t.get("edit_input_ids")));
    if (t.has("edit_attention_mask"))
      r.add("edit_attention_mask",
            compare_exact("edit_attention_mask", in.attention_mask.reshape({-1}),
                          t.get("edit_attention_mask")));
    if (t.has("edit_image_grid_thw"))
      r.add("edit_image_grid_thw",
            compare_exact("edit_image_grid_thw",
                          ids_of({in.image->grid_thw.begin(), in.image->grid_thw.end()}),
                          t.get("edit_image_grid_thw").reshape({-1})));
    if (t.has("edit_prefix_ids"))
      r.add("edit_prefix_ids", compare_exact("edit_prefix_ids",
                                             in.input_ids.reshape({-1}).narrow(
                                                 0, 0, pipeline::qwen_image_edit_template().drop),
                                             t.get("edit_prefix_ids")));
  }
  return r;
}

CaseResult run_processor(const GoldenSet& set, const GoldenCase& c) {
  const auto folder = io::ModelFolder::open(set.model_dir(c));
  const auto config = pipeline::QwenVLImageProcessorConfig::from_folder(
      folder.component_dir(c.param("component", std::string("processor"))));
  CaseTensors t(c);
  const auto out = pipeline::qwen_vl_preprocess(t.get("image_uint8"), config);
  CaseResult r;
  r.add("pixel_values",
        compare("pixel_values", out.pixel_values, t.get("pixel_values"), c.tol("atol", 1e-6), 0));
  r.add("image_grid_thw",
        compare_exact("image_grid_thw", ids_of({out.grid_thw.begin(), out.grid_thw.end()}),
                      t.get("image_grid_thw").reshape({-1})));
  return r;
}

CaseResult run_text_encoder(const GoldenSet& set, const GoldenCase& c, const VerifyOptions& o) {
  const auto folder = io::ModelFolder::open(set.model_dir(c));
  auto model = models::load_qwen2_5_vl(folder, "text_encoder", o.device, torch::kFloat32);
  CaseTensors t(c);
  const double atol = c.tol("atol", 1e-4);
  CaseResult r;
  torch::Tensor pixels;
  std::array<int64_t, 3> grid{};
  const bool image = t.has("pixel_values");
  if (image) {
    pixels = t.get("pixel_values");
    grid = grid_of(t.get("image_grid_thw"));
    // The processor's part too, from the same image.
    if (t.has("image_uint8") && folder.has_component("processor")) {
      const auto cfg =
          pipeline::QwenVLImageProcessorConfig::from_folder(folder.component_dir("processor"));
      const auto ours = pipeline::qwen_vl_preprocess(t.get("image_uint8"), cfg);
      r.add("pixel_values", compare("pixel_values", ours.pixel_values, pixels, 1e-6, 0));
    }
  }
  const auto out = model->forward(t.get("input_ids"), t.get("attention_mask"), pixels, grid);
  r.add("hidden_states_last",
        compare("hidden_states_last", out.last_hidden_state, t.get("hidden_states_last"), atol, 0));
  if (t.has("position_ids"))
    r.add("position_ids", compare_exact("position_ids", out.position_ids, t.get("position_ids")));
  if (t.has("rope_deltas"))
    r.add("rope_deltas", compare_exact("rope_deltas", out.rope_deltas, t.get("rope_deltas")));
  if (t.has("image_embeds"))
    r.add("image_embeds",
          compare("image_embeds", out.image_embeds, t.get("image_embeds"), atol, 0));
  const auto& tmpl = image ? pipeline::qwen_image_edit_template() : pipeline::qwen_image_template();
  check_param(r, c, "drop_idx", tmpl.drop);
  if (t.has("prompt_embeds")) {
    // The pipeline keeps the attended rows and drops the template's prefix.
    const auto mask = t.get("attention_mask")[0].to(torch::kBool);
    auto kept = out.last_hidden_state[0].index({mask.to(out.last_hidden_state.device())});
    kept = kept.narrow(0, tmpl.drop, kept.size(0) - tmpl.drop).unsqueeze(0);
    r.add("prompt_embeds", compare("prompt_embeds", kept, t.get("prompt_embeds"), atol, 0));
    if (t.has("prompt_embeds_mask"))  // whole prompts: every kept row attended
      r.add("prompt_embeds_mask",
            compare_exact("prompt_embeds_mask", torch::ones({1, kept.size(1)}, torch::kInt64),
                          t.get("prompt_embeds_mask")));
  }
  return r;
}

CaseResult run_vae(const GoldenSet& set, const GoldenCase& c, const VerifyOptions& o) {
  const auto folder = io::ModelFolder::open(set.model_dir(c));
  auto vae = models::load_qwenimage_vae(folder, o.device, torch::kFloat32);
  CaseTensors t(c);
  CaseResult r;
  auto image = t.get("image");  // [1, 3, 1, H, W]
  if (image.dim() != 5 || image.size(2) != 1)
    throw FormatError(c.file + ": 'image' must be one frame [B, 3, 1, H, W]");
  if (t.has("image_uint8")) {
    const auto u8 = t.get("image_uint8").permute({2, 0, 1}).unsqueeze(0).to(torch::kFloat32);
    r.add("image", compare("image", u8 / 255.0 * 2 - 1, image.squeeze(2), 1e-6, 0));
  }
  const double enc_atol = nested_tol(c, "encode", "atol", 1e-4);
  const double dec_atol = nested_tol(c, "decode", "atol", 1e-4);
  const auto dist = vae->encode(image.squeeze(2));
  if (t.has("latent_mean"))
    r.add("latent_mean",
          compare("latent_mean", dist.mean.unsqueeze(2), t.get("latent_mean"), enc_atol, 0));
  if (t.has("latent_logvar"))
    r.add("latent_logvar",
          compare("latent_logvar", dist.logvar.unsqueeze(2), t.get("latent_logvar"), enc_atol, 0));
  const auto normalized = vae->config().to_latents(dist.mean);
  if (t.has("normalized_latents"))
    r.add("normalized_latents", compare("normalized_latents", normalized.unsqueeze(2),
                                        t.get("normalized_latents"), enc_atol, 0));
  if (t.has("decoded")) {
    // From the reference's latents, so that the decoder alone is measured.
    const auto z =
        t.has("normalized_latents") ? t.get("normalized_latents").squeeze(2) : normalized;
    const auto decoded = vae->decode(vae->config().from_latents(z.to(o.device)));
    r.add("decoded", compare("decoded", decoded.unsqueeze(2), t.get("decoded"), dec_atol, 0));
  }
  return r;
}

std::vector<models::QwenImageGrid> case_grids(const GoldenCase& c) {
  std::vector<models::QwenImageGrid> grids;
  const auto& shapes = c.params.at("img_shapes");
  // [[f, h, w], ...] for the one sample, or [[[f, h, w], ...]] per sample (batch 1).
  const auto& list =
      shapes.size() == 1 && shapes[0].is_array() && shapes[0].size() > 0 && shapes[0][0].is_array()
          ? shapes[0]
          : shapes;
  for (const auto& g : list) {
    if (!g.is_array() || g.size() != 3) c.bad_param("img_shapes", "grids [frames, rows, cols]");
    grids.push_back({g[0].get<int64_t>(), g[1].get<int64_t>(), g[2].get<int64_t>()});
  }
  return grids;
}

CaseResult run_transformer(const GoldenSet& set, const GoldenCase& c, const VerifyOptions& o) {
  const auto folder = io::ModelFolder::open(set.model_dir(c));
  auto model = models::load_qwenimage_transformer(folder, o.device, torch::kFloat32,
                                                  c.param("component", std::string("transformer")),
                                                  o.weights);
  CaseTensors t(c);
  if (t.has("encoder_hidden_states_mask") &&
      !t.get("encoder_hidden_states_mask").to(torch::kBool).all().item<bool>())
    throw InvalidArgument(c.file +
                          ": a text mask with padding; the pipelines pass whole "
                          "prompts (every token attended)");
  models::Intermediates captured;
  auto out = model->forward(t.get("hidden_states").to(o.device), t.get("timestep"),
                            t.get("encoder_hidden_states"), case_grids(c), {}, &captured);
  CaseResult r;
  const auto expected = t.get("output");
  if (o.weights)
    r.add("output", compare_relative_rms("output", out, expected, quantized_tolerance(*o.weights)));
  else
    r.add("output", compare("output", out, expected, c.tol("atol", 1e-4), 0));
  return r;
}

CaseResult run_scheduler(const GoldenSet& set, const GoldenCase& c) {
  const auto folder = io::ModelFolder::open(set.model_dir(c));
  auto scheduler =
      schedulers::make_scheduler(folder.component_config("scheduler", "scheduler_config.json"));
  auto* flow = dynamic_cast<schedulers::FlowMatchScheduler*>(scheduler.get());
  if (!flow) throw FormatError(c.where + ": the scheduler is not a flow-matching one");
  CaseTensors t(c);
  CaseResult r;
  const int steps = c.param("num_inference_steps", 4);
  const auto lens = c.params.at("image_seq_lens");
  const auto mus = c.params.value("mu", nlohmann::json::array());
  const double atol = c.tol("atol", 1e-6);
  for (size_t i = 0; i < lens.size(); ++i) {
    const int64_t L = lens[i].get<int64_t>();
    const std::string n = std::to_string(L);
    const double mu = flow->shift_mu_for(L);
    if (i < mus.size())
      r.add("mu_" + n, compare("mu_" + n, torch::tensor(mu, torch::kFloat64),
                               torch::tensor(mus[i].get<double>(), torch::kFloat64), 1e-12, 0));
    flow->set_shift_mu(mu);
    flow->set_timesteps_from_sigmas(schedulers::flux_default_sigmas(steps));
    if (t.has("timesteps_" + n))
      r.add("timesteps_" + n, compare("timesteps_" + n, flow->timesteps().to(torch::kFloat64),
                                      t.get("timesteps_" + n), 1e-4, 0));
    if (t.has("sigmas_" + n))
      r.add("sigmas_" + n, compare("sigmas_" + n, flow->sigmas().to(torch::kFloat64),
                                   t.get("sigmas_" + n), atol, 0));
  }
  // The Euler steps on the first sequence length's schedule.
  if (t.has("sample") && !lens.empty()) {
    flow->set_shift_mu(flow->shift_mu_for(lens[0].get<int64_t>()));
    flow->set_timesteps_from_sigmas(schedulers::flux_default_sigmas(steps));
    auto x = t.get("sample");
    for (int i = 0; t.has("model_output_" + std::to_string(i)); ++i) {
      const auto name = "sample_after_step_" + std::to_string(i);
      x = scheduler->step(t.get("model_output_" + std::to_string(i)), flow->timesteps()[i], x, {})
              .prev_sample;
      if (t.has(name)) r.add(name, compare(name, x, t.get(name), atol, 0));
    }
  }
  return r;
}

std::optional<std::string> optional_prompt(const GoldenCase& c, const std::string& key) {
  if (!c.params.contains(key) || c.params[key].is_null()) return std::nullopt;
  return c.param(key, std::string());
}

CaseResult run_pipeline(const GoldenSet& set, const GoldenCase& c, const VerifyOptions& o) {
  const auto folder = io::ModelFolder::open(set.model_dir(c));
  pipeline::QwenImagePipeline pipe(folder, o.device, torch::kFloat32);
  if (o.sequence_group) pipe.set_sequence_group(o.sequence_group);
  CaseTensors t(c);
  pipeline::QwenImageSampling s;
  s.steps = c.param("num_inference_steps", 50);
  s.true_cfg_scale = c.param("true_cfg_scale", 4.0);
  s.latents = t.get("latents");
  std::map<std::string, torch::Tensor> traced;
  s.on_step = [&](const pipeline::QwenImageStep& st) {
    const std::string n = std::to_string(st.index);
    traced["timestep_" + n] = st.transformer_timestep.to(torch::kCPU);
    traced["noise_pred_cond_" + n] = st.transformer_out.to(torch::kCPU);
    if (st.transformer_out_negative.defined())
      traced["noise_pred_uncond_" + n] = st.transformer_out_negative.to(torch::kCPU);
    traced["latents_" + n] = st.latents.to(torch::kCPU);
    return StepAction(true);
  };
  pipeline::QwenImageResult out;
  const bool edit = t.has("image_uint8");
  if (edit) {
    pipeline::QwenImageEdit e;
    e.prompt = c.param("prompt", std::string());
    e.negative_prompt = optional_prompt(c, "negative_prompt");
    e.image = t.get("image_uint8");
    e.width = c.param("width", 0);
    e.height = c.param("height", 0);
    e.sampling = s;
    out = pipe.edit(e);
    traced["resized_image_uint8"] = out.source_resized;
    traced["image_latents_packed"] = out.image_latents_packed;
    traced["image_grid_thw"] =
        ids_of({out.image_grid_thw.begin(), out.image_grid_thw.end()}).view({1, 3});
    traced["negative_image_grid_thw"] = traced["image_grid_thw"];
  } else {
    pipeline::QwenImageTextToImage r;
    r.prompt = c.param("prompt", std::string());
    r.negative_prompt = optional_prompt(c, "negative_prompt");
    r.width = c.param("width", 1024);
    r.height = c.param("height", 1024);
    r.sampling = s;
    out = pipe.text_to_image(r);
  }
  traced["prompt_embeds"] = out.prompt_embeds;
  traced["input_ids"] = out.input_ids;
  if (out.negative_prompt_embeds.defined()) {
    traced["negative_prompt_embeds"] = out.negative_prompt_embeds;
    traced["negative_input_ids"] = out.negative_input_ids;
  }
  traced["image"] = out.image;

  CaseResult r;
  const double image_atol = nested_tol(c, "image", "atol", 1e-4);
  const double latents_atol = nested_tol(c, "latents_final", "atol", 1e-4);
  for (const auto& [name, got] : traced) {
    if (!t.has(name)) continue;
    const auto expected = t.get(name);
    if (expected.scalar_type() == torch::kInt64 || expected.scalar_type() == torch::kUInt8)
      r.add(name, compare_exact(name, got.to(expected.scalar_type()), expected));
    else if (name == "image")
      r.add(name, compare(name, got, expected, image_atol, 0));
    else if (name.rfind("timestep_", 0) == 0)
      r.add(name, compare(name, got, expected, 1e-6, 0));
    else  // latents, predictions, embeddings: the final latents' tolerance per unit magnitude
      r.add(name, compare(name, got, expected,
                          latents_atol * std::max(1.0, expected.abs().max().item<double>()), 0));
  }
  for (const char* required : {"image", "latents_0"})
    if (t.has(required) && !traced.count(required))
      r.add(required, Comparison{false, 0, std::string("not produced"), {}});
  return r;
}

}  // namespace

bool is_qwenimage_set(const GoldenSet& set) {
  namespace fs = std::filesystem;
  const auto index = fs::path(set.model_dir()) / "model_index.json";
  if (!fs::exists(index)) return false;
  return io::ModelFolder::open(set.model_dir())
             .model_index()
             .get<std::string>("_class_name", "")
             .rfind("QwenImage", 0) == 0;
}

CaseResult verify_qwenimage(const GoldenSet& set, const GoldenCase& c, const VerifyOptions& o) {
  if (c.component == "tokenizer") return run_tokenizer(set, c);
  if (c.component == "processor") return run_processor(set, c);
  if (c.component == "text_encoder") return run_text_encoder(set, c, o);
  if (c.component == "vae") return run_vae(set, c, o);
  if (c.component == "transformer") return run_transformer(set, c, o);
  if (c.component == "scheduler") return run_scheduler(set, c);
  if (c.component == "pipeline") return run_pipeline(set, c, o);
  CaseResult r;
  r.reason = "unsupported component '" + c.component + "' for a Qwen-Image set";
  return r;
}

}  // namespace diffuse::verify
