// diffusers / transformers configs inferred from the structure of an LDM-layout checkpoint.
// What the shapes determine is read from them; the rest (heads, group count, sample size)
// takes the values of the SD1.x / SD2.x releases and is reported as assumed.
#include "diffuse/errors.h"
#include "io/ldm_key_map.h"

namespace diffuse::io::ldm {
namespace {

using json = nlohmann::json;

// SD1 and SD2 UNets, VAEs and text encoders all use 32 GroupNorm groups; GroupNorm weights do
// not record the group count.
constexpr int kNormGroups = 32;
// SD2 (and OpenCLIP / CLIP text encoders) use 64-wide attention heads.
constexpr int64_t kHeadWidth = 64;
// SD1 fixes the number of heads instead (num_heads: 8 in v1-inference.yaml).
constexpr int64_t kSd1Heads = 8;

// Heads of 64 channels each; a width that is no multiple of 64 is not an SD-sized model, and
// one head is at least a valid shape (the value is reported as assumed either way).
int64_t heads_for(int64_t channels) {
  return channels % kHeadWidth == 0 ? channels / kHeadWidth : 1;
}

// A list, or its single value when all entries agree (the form diffusers' hub configs use).
json uniform_or_list(const std::vector<int64_t>& values) {
  for (auto v : values)
    if (v != values.front()) return json(values);
  return json(values.front());
}

}  // namespace

json infer_unet_config(const UnetLayout& L, const std::string& family, bool v_prediction,
                       std::vector<std::string>* assumed) {
  std::vector<int64_t> channels, layers, depths;
  json down_types = json::array(), up_types = json::array();
  for (const auto& level : L.down) {
    channels.push_back(level.channels);
    layers.push_back(static_cast<int64_t>(level.blocks.size()));
    depths.push_back(level.attention ? level.transformer_depth : L.mid_transformer_depth);
    down_types.push_back(level.attention ? "CrossAttnDownBlock2D" : "DownBlock2D");
  }
  for (const auto& level : L.up)
    up_types.push_back(level.attention ? "CrossAttnUpBlock2D" : "UpBlock2D");

  if (L.time_embed_dim != 4 * channels.front())
    throw FormatError("single-file UNet: time_embed has " + std::to_string(L.time_embed_dim) +
                      " channels, diffusers builds 4 x block_out_channels[0] = " +
                      std::to_string(4 * channels.front()));

  bool sd2 = family == "sd2";
  json heads;
  if (sd2) {
    std::vector<int64_t> per_level;
    for (auto c : channels) per_level.push_back(heads_for(c));
    heads = per_level;  // diffusers' attention_head_dim is the number of heads per level
  } else {
    heads = kSd1Heads;
  }
  assumed->push_back("unet.attention_head_dim");
  assumed->push_back("unet.norm_num_groups");
  // SD 2.x 768-v needs attention upcast in half precision (the hub's 2-1 config sets it).
  bool upcast = sd2 && v_prediction;
  assumed->push_back("unet.upcast_attention");
  assumed->push_back("unet.sample_size");

  json c = {
      {"_class_name", "UNet2DConditionModel"},
      {"act_fn", "silu"},
      {"attention_head_dim", heads},
      {"block_out_channels", channels},
      {"center_input_sample", false},
      {"cross_attention_dim", L.cross_attention_dim},
      {"down_block_types", down_types},
      {"downsample_padding", 1},
      {"dual_cross_attention", false},
      {"flip_sin_to_cos", true},
      {"freq_shift", 0},
      {"in_channels", L.in_channels},
      {"layers_per_block", uniform_or_list(layers)},
      {"mid_block_scale_factor", 1},
      {"norm_eps", 1e-5},
      {"norm_num_groups", kNormGroups},
      {"num_class_embeds", nullptr},
      {"only_cross_attention", false},
      {"out_channels", L.out_channels},
      {"sample_size", upcast ? 96 : 64},
      {"transformer_layers_per_block", uniform_or_list(depths)},
      {"up_block_types", up_types},
      {"upcast_attention", upcast},
      {"use_linear_projection", L.use_linear_projection},
  };
  return c;
}

json infer_vae_config(const VaeLayout& L, const std::string& family, bool v_prediction,
                      std::vector<std::string>* assumed) {
  size_t n = L.block_out_channels.size();
  assumed->push_back("vae.norm_num_groups");
  assumed->push_back("vae.scaling_factor");
  assumed->push_back("vae.sample_size");
  return {
      {"_class_name", "AutoencoderKL"},
      {"act_fn", "silu"},
      {"block_out_channels", L.block_out_channels},
      {"down_block_types", std::vector<std::string>(n, "DownEncoderBlock2D")},
      {"in_channels", L.in_channels},
      {"latent_channels", L.latent_channels},
      {"layers_per_block", L.layers_per_block},
      {"norm_num_groups", kNormGroups},
      {"out_channels", L.out_channels},
      {"sample_size", family == "sd2" && v_prediction ? 768 : 512},
      {"scaling_factor", 0.18215},  // SD1.x and SD2.x VAEs
      {"up_block_types", std::vector<std::string>(n, "UpDecoderBlock2D")},
  };
}

json infer_text_config(const TextLayout& L, int num_layers, std::vector<std::string>* assumed) {
  int64_t heads = heads_for(L.hidden_size);
  assumed->push_back("text_encoder.num_attention_heads");
  return {
      {"architectures", {"CLIPTextModel"}},
      {"attention_dropout", 0.0},
      {"bos_token_id", 0},
      {"dropout", 0.0},
      {"eos_token_id", 2},
      // OpenCLIP (SD2) uses exact GELU; OpenAI CLIP (SD1) the sigmoid approximation.
      {"hidden_act", L.open_clip ? "gelu" : "quick_gelu"},
      {"hidden_size", L.hidden_size},
      {"initializer_factor", 1.0},
      {"initializer_range", 0.02},
      {"intermediate_size", L.intermediate_size},
      {"layer_norm_eps", 1e-5},
      {"max_position_embeddings", L.max_positions},
      {"model_type", "clip_text_model"},
      {"num_attention_heads", heads},
      {"num_hidden_layers", num_layers},
      {"pad_token_id", 1},
      {"projection_dim", L.open_clip ? 512 : 768},
      {"vocab_size", L.vocab_size},
  };
}

json default_scheduler_config(bool v_prediction) {
  // The scheduler every SD1.x / SD2.x release ships (scheduler/scheduler_config.json).
  return {
      {"_class_name", "PNDMScheduler"},
      {"beta_end", 0.012},
      {"beta_schedule", "scaled_linear"},
      {"beta_start", 0.00085},
      {"clip_sample", false},
      {"num_train_timesteps", 1000},
      {"prediction_type", v_prediction ? "v_prediction" : "epsilon"},
      {"set_alpha_to_one", false},
      {"skip_prk_steps", true},
      {"steps_offset", 1},
      {"timestep_spacing", "leading"},
      {"trained_betas", nullptr},
  };
}

const std::vector<std::string>& unet_shape_keys() {
  static const std::vector<std::string> keys = {
      "in_channels",         "out_channels",          "block_out_channels",
      "layers_per_block",    "down_block_types",      "up_block_types",
      "cross_attention_dim", "use_linear_projection", "transformer_layers_per_block"};
  return keys;
}

const std::vector<std::string>& vae_shape_keys() {
  static const std::vector<std::string> keys = {"in_channels", "out_channels", "block_out_channels",
                                                "layers_per_block", "latent_channels"};
  return keys;
}

const std::vector<std::string>& text_shape_keys() {
  static const std::vector<std::string> keys = {"hidden_size", "num_hidden_layers",
                                                "intermediate_size", "vocab_size",
                                                "max_position_embeddings"};
  return keys;
}

void check_config_against_weights(const json& given, const json& inferred,
                                  const std::vector<std::string>& keys,
                                  const std::string& config_source, const std::string& weights) {
  for (const auto& key : keys) {
    if (!given.contains(key) || given[key].is_null() || !inferred.contains(key)) continue;
    json want = inferred[key];
    json have = given[key];
    // diffusers accepts a per-level value either as one number or as a list.
    if (want.is_array() != have.is_array()) {
      json& scalar = want.is_array() ? have : want;
      size_t n = want.is_array() ? want.size() : have.size();
      scalar = json(std::vector<json>(n, scalar));
    }
    if (want != have)
      throw ConfigError(config_source + ": key '" + key + "' is " + given[key].dump() +
                        " but the weights in " + weights + " need " + inferred[key].dump());
  }
}

}  // namespace diffuse::io::ldm
