#include "models/builtin_configs.h"

#include <map>

#include "diffuse/errors.h"

namespace diffuse::models {
namespace {

using nlohmann::json;

// unet/config.json of stabilityai/stable-diffusion-2-1-base. (diffusers' historical naming:
// attention_head_dim holds the number of heads, 5/10/20/20 heads of dim 64.)
json sd21_base_unet() {
  return json::parse(R"({
    "_class_name": "UNet2DConditionModel",
    "act_fn": "silu",
    "attention_head_dim": [5, 10, 20, 20],
    "block_out_channels": [320, 640, 1280, 1280],
    "center_input_sample": false,
    "cross_attention_dim": 1024,
    "down_block_types": ["CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D",
                         "DownBlock2D"],
    "downsample_padding": 1,
    "dual_cross_attention": false,
    "flip_sin_to_cos": true,
    "freq_shift": 0,
    "in_channels": 4,
    "layers_per_block": 2,
    "mid_block_scale_factor": 1,
    "norm_eps": 1e-05,
    "norm_num_groups": 32,
    "num_class_embeds": null,
    "only_cross_attention": false,
    "out_channels": 4,
    "sample_size": 64,
    "up_block_types": ["UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D",
                       "CrossAttnUpBlock2D"],
    "upcast_attention": false,
    "use_linear_projection": true
  })");
}

// vae/config.json shared by SD 1.x and 2.x (sample_size differs per model).
json sd_vae(int sample_size) {
  json j = json::parse(R"({
    "_class_name": "AutoencoderKL",
    "act_fn": "silu",
    "block_out_channels": [128, 256, 512, 512],
    "down_block_types": ["DownEncoderBlock2D", "DownEncoderBlock2D", "DownEncoderBlock2D",
                         "DownEncoderBlock2D"],
    "in_channels": 3,
    "latent_channels": 4,
    "layers_per_block": 2,
    "norm_num_groups": 32,
    "out_channels": 3,
    "scaling_factor": 0.18215,
    "up_block_types": ["UpDecoderBlock2D", "UpDecoderBlock2D", "UpDecoderBlock2D",
                       "UpDecoderBlock2D"]
  })");
  j["sample_size"] = sample_size;
  return j;
}

// text_encoder/config.json of SD 2.x: OpenCLIP ViT-H/14's text tower without its last layer.
json sd2_text_encoder() {
  return json::parse(R"({
    "architectures": ["CLIPTextModel"],
    "bos_token_id": 0,
    "eos_token_id": 2,
    "hidden_act": "gelu",
    "hidden_size": 1024,
    "intermediate_size": 4096,
    "layer_norm_eps": 1e-05,
    "max_position_embeddings": 77,
    "model_type": "clip_text_model",
    "num_attention_heads": 16,
    "num_hidden_layers": 23,
    "pad_token_id": 1,
    "projection_dim": 512,
    "vocab_size": 49408
  })");
}

// text_encoder/config.json of SD 1.x: OpenAI CLIP ViT-L/14's text tower.
json sd1_text_encoder() {
  return json::parse(R"({
    "architectures": ["CLIPTextModel"],
    "bos_token_id": 0,
    "eos_token_id": 2,
    "hidden_act": "quick_gelu",
    "hidden_size": 768,
    "intermediate_size": 3072,
    "layer_norm_eps": 1e-05,
    "max_position_embeddings": 77,
    "model_type": "clip_text_model",
    "num_attention_heads": 12,
    "num_hidden_layers": 12,
    "pad_token_id": 1,
    "projection_dim": 768,
    "vocab_size": 49408
  })");
}

// unet/config.json of stabilityai/stable-diffusion-xl-base-1.0: three levels, 2 and 10
// transformer layers in the two attention levels, the text_time added embedding
// (2816 = 6 time ids x 256 + CLIP-G's 1280).
json sdxl_unet() {
  return json::parse(R"({
    "_class_name": "UNet2DConditionModel",
    "act_fn": "silu",
    "addition_embed_type": "text_time",
    "addition_embed_type_num_heads": 64,
    "addition_time_embed_dim": 256,
    "attention_head_dim": [5, 10, 20],
    "block_out_channels": [320, 640, 1280],
    "center_input_sample": false,
    "cross_attention_dim": 2048,
    "down_block_types": ["DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"],
    "downsample_padding": 1,
    "dual_cross_attention": false,
    "flip_sin_to_cos": true,
    "freq_shift": 0,
    "in_channels": 4,
    "layers_per_block": 2,
    "mid_block_scale_factor": 1,
    "norm_eps": 1e-05,
    "norm_num_groups": 32,
    "only_cross_attention": false,
    "out_channels": 4,
    "projection_class_embeddings_input_dim": 2816,
    "sample_size": 128,
    "transformer_layers_per_block": [1, 2, 10],
    "up_block_types": ["CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"],
    "upcast_attention": null,
    "use_linear_projection": true
  })");
}

// text_encoder_2/config.json of SDXL: OpenCLIP ViT-bigG/14's text tower with its projection.
json sdxl_text_encoder_2() {
  return json::parse(R"({
    "architectures": ["CLIPTextModelWithProjection"],
    "bos_token_id": 0,
    "eos_token_id": 2,
    "hidden_act": "gelu",
    "hidden_size": 1280,
    "intermediate_size": 5120,
    "layer_norm_eps": 1e-05,
    "max_position_embeddings": 77,
    "model_type": "clip_text_model",
    "num_attention_heads": 20,
    "num_hidden_layers": 32,
    "pad_token_id": 1,
    "projection_dim": 1280,
    "vocab_size": 49408
  })");
}

json scheduler(const char* cls, const char* prediction_type) {
  json j = json::parse(R"({
    "beta_end": 0.012,
    "beta_schedule": "scaled_linear",
    "beta_start": 0.00085,
    "clip_sample": false,
    "num_train_timesteps": 1000,
    "set_alpha_to_one": false,
    "skip_prk_steps": true,
    "steps_offset": 1,
    "trained_betas": null
  })");
  j["_class_name"] = cls;
  j["prediction_type"] = prediction_type;
  return j;
}

std::map<std::string, ArchConfigs> make_archs() {
  std::map<std::string, ArchConfigs> m;
  {
    ArchConfigs a;
    a.name = "sd2.1-base";
    a.description = "Stable Diffusion 2.1-base (512x512, epsilon)";
    a.unet = sd21_base_unet();
    a.vae = sd_vae(512);
    a.text_encoder = sd2_text_encoder();
    a.scheduler = scheduler("PNDMScheduler", "epsilon");
    m[a.name] = a;
  }
  {
    ArchConfigs a;
    a.name = "sd2.1";
    a.description = "Stable Diffusion 2.1 (768x768, v-prediction)";
    a.unet = sd21_base_unet();
    a.unet["sample_size"] = 96;
    a.unet["upcast_attention"] = true;
    a.vae = sd_vae(768);
    a.text_encoder = sd2_text_encoder();
    a.scheduler = scheduler("DDIMScheduler", "v_prediction");
    m[a.name] = a;
  }
  {
    ArchConfigs a;
    a.name = "sd1.5";
    a.description = "Stable Diffusion 1.5 (512x512, epsilon)";
    a.unet = sd21_base_unet();
    a.unet["attention_head_dim"] = 8;
    a.unet["cross_attention_dim"] = 768;
    a.unet.erase("use_linear_projection");
    a.unet.erase("upcast_attention");
    a.vae = sd_vae(512);
    a.text_encoder = sd1_text_encoder();
    a.scheduler = scheduler("PNDMScheduler", "epsilon");
    m[a.name] = a;
  }
  {
    ArchConfigs a;
    a.name = "sdxl";
    a.description = "Stable Diffusion XL base 1.0 (1024x1024, epsilon)";
    a.unet = sdxl_unet();
    a.vae = sd_vae(1024);
    a.vae["scaling_factor"] = 0.13025;
    a.vae["force_upcast"] = true;
    a.text_encoder = sd1_text_encoder();
    a.text_encoder_2 = sdxl_text_encoder_2();
    a.scheduler = scheduler("EulerDiscreteScheduler", "epsilon");
    a.scheduler["timestep_spacing"] = "leading";
    a.scheduler["interpolation_type"] = "linear";
    a.scheduler["use_karras_sigmas"] = false;
    m[a.name] = a;
  }
  {
    // SD2's structure at toy width: for smoke tests of the bench itself.
    ArchConfigs a;
    a.name = "tiny";
    a.description = "SD2-structured toy model (tests)";
    a.unet = sd21_base_unet();
    a.unet["block_out_channels"] = {32, 64, 64, 64};
    a.unet["attention_head_dim"] = {1, 2, 2, 2};
    a.unet["cross_attention_dim"] = 32;
    a.unet["layers_per_block"] = 1;
    a.unet["norm_num_groups"] = 8;
    a.unet["sample_size"] = 8;
    a.vae = sd_vae(64);
    a.vae["block_out_channels"] = {16, 32};
    a.vae["down_block_types"] = {"DownEncoderBlock2D", "DownEncoderBlock2D"};
    a.vae["up_block_types"] = {"UpDecoderBlock2D", "UpDecoderBlock2D"};
    a.vae["layers_per_block"] = 1;
    a.vae["norm_num_groups"] = 8;
    a.text_encoder = sd2_text_encoder();
    a.text_encoder["hidden_size"] = 32;
    a.text_encoder["intermediate_size"] = 64;
    a.text_encoder["num_attention_heads"] = 2;
    a.text_encoder["num_hidden_layers"] = 2;
    a.text_encoder["vocab_size"] = 1000;
    a.scheduler = scheduler("PNDMScheduler", "epsilon");
    m[a.name] = a;
  }
  return m;
}

const std::map<std::string, ArchConfigs>& archs() {
  static const std::map<std::string, ArchConfigs> m = make_archs();
  return m;
}

}  // namespace

const ArchConfigs& builtin_arch(const std::string& name) {
  auto it = archs().find(name);
  if (it != archs().end()) return it->second;
  std::string list;
  for (const auto& n : builtin_arch_names()) list += (list.empty() ? "" : ", ") + n;
  throw InvalidArgument("unknown architecture '" + name + "' (expected one of: " + list + ")");
}

std::vector<std::string> builtin_arch_names() {
  return {"sd2.1-base", "sd2.1", "sd1.5", "sdxl", "tiny"};
}

nlohmann::json hidream_i1_transformer_config() {
  std::vector<int> llama_layers;
  for (int i = 0; i < 32; ++i) llama_layers.push_back(i);
  for (int i = 0; i < 16; ++i) llama_layers.push_back(31);
  return {{"_class_name", "HiDreamImageTransformer2DModel"},
          {"patch_size", 2},
          {"in_channels", 16},
          {"out_channels", 16},
          {"num_layers", 16},
          {"num_single_layers", 32},
          {"attention_head_dim", 128},
          {"num_attention_heads", 20},
          {"caption_channels", {4096, 4096}},
          {"text_emb_dim", 2048},
          {"num_routed_experts", 4},
          {"num_activated_experts", 2},
          {"axes_dims_rope", {64, 32, 32}},
          {"max_resolution", {128, 128}},
          {"llama_layers", llama_layers}};
}

bool is_hidream_arch(const std::string& name) {
  return name == "hidream-i1";
}

nlohmann::json flux_transformer_config(bool guidance_embeds) {
  return {{"_class_name", "FluxTransformer2DModel"},
          {"patch_size", 1},
          {"in_channels", 64},
          {"out_channels", nullptr},
          {"num_layers", 19},
          {"num_single_layers", 38},
          {"attention_head_dim", 128},
          {"num_attention_heads", 24},
          {"joint_attention_dim", 4096},
          {"pooled_projection_dim", 768},
          {"guidance_embeds", guidance_embeds},
          {"axes_dims_rope", {16, 56, 56}}};
}

bool is_flux_arch(const std::string& name) {
  return name == "flux-dev" || name == "flux-schnell";
}

nlohmann::json qwenimage_transformer_config() {
  // Qwen/Qwen-Image and Qwen-Image-Edit's transformer/config.json.
  return {{"_class_name", "QwenImageTransformer2DModel"},
          {"patch_size", 2},
          {"in_channels", 64},
          {"out_channels", 16},
          {"num_layers", 60},
          {"attention_head_dim", 128},
          {"num_attention_heads", 24},
          {"joint_attention_dim", 3584},
          {"guidance_embeds", false},
          {"axes_dims_rope", {16, 56, 56}}};
}

bool is_qwenimage_arch(const std::string& name) {
  return name == "qwen-image";
}

nlohmann::json t5_xxl_encoder_config() {
  return {{"architectures", {"T5EncoderModel"}},
          {"d_ff", 10240},
          {"d_kv", 64},
          {"d_model", 4096},
          {"feed_forward_proj", "gated-gelu"},
          {"layer_norm_epsilon", 1e-6},
          {"num_heads", 64},
          {"num_layers", 24},
          {"relative_attention_max_distance", 128},
          {"relative_attention_num_buckets", 32},
          {"vocab_size", 32128}};
}

nlohmann::json llama31_8b_config() {
  return {{"architectures", {"LlamaForCausalLM"}},
          {"hidden_act", "silu"},
          {"hidden_size", 4096},
          {"intermediate_size", 14336},
          {"num_attention_heads", 32},
          {"num_hidden_layers", 32},
          {"num_key_value_heads", 8},
          {"rms_norm_eps", 1e-5},
          {"rope_theta", 500000.0},
          {"rope_scaling",
           {{"factor", 8.0},
            {"low_freq_factor", 1.0},
            {"high_freq_factor", 4.0},
            {"original_max_position_embeddings", 8192},
            {"rope_type", "llama3"}}},
          {"vocab_size", 128256}};
}

nlohmann::json clip_l_text_config() {
  return sd1_text_encoder();
}
nlohmann::json clip_g_text_config() {
  return sdxl_text_encoder_2();
}

nlohmann::json flux_vae_config() {
  auto j = sd_vae(1024);
  j["latent_channels"] = 16;
  j["scaling_factor"] = 0.3611;
  j["shift_factor"] = 0.1159;
  j["use_quant_conv"] = false;
  j["use_post_quant_conv"] = false;
  j["force_upcast"] = true;
  return j;
}

bool is_dit_arch(const std::string& name) {
  return is_hidream_arch(name) || is_flux_arch(name) || is_qwenimage_arch(name);
}

}  // namespace diffuse::models
