// UNet2DConditionConfig::from_json: diffusers' defaults for absent keys, its per-block
// broadcasting rules, and checks that turn would-be shape errors at run time into
// ConfigErrors at load time.
#include <set>

#include "models/config_values.h"
#include "models/unet2d_condition.h"

namespace diffuse::models {
namespace {

const std::set<std::string> kDownTypes = {"CrossAttnDownBlock2D", "DownBlock2D"};
const std::set<std::string> kUpTypes = {"CrossAttnUpBlock2D", "UpBlock2D"};

std::string joined(const std::set<std::string>& names) {
  std::string s;
  for (const auto& n : names) s += (s.empty() ? "" : ", ") + n;
  return s;
}

// diffusers strips a "UNetRes" prefix from block type names.
std::string strip_prefix(const std::string& t) {
  return t.rfind("UNetRes", 0) == 0 ? t.substr(7) : t;
}

std::vector<std::string> block_types(const io::JsonConfig& cfg, const std::string& key,
                                     const std::vector<std::string>& fallback,
                                     const std::set<std::string>& known) {
  auto types = read_string_list(cfg, key, fallback);
  for (auto& t : types) {
    t = strip_prefix(t);
    if (!known.count(t))
      cfg.fail(key, "unknown block type '" + t + "' (supported: " + joined(known) + ")");
  }
  return types;
}

}  // namespace

UNet2DConditionConfig UNet2DConditionConfig::from_json(const io::JsonConfig& cfg) {
  UNet2DConditionConfig c;
  c.source = cfg.source();
  // Features of other UNet2DConditionModel variants (SDXL, Kandinsky, LCM, GLIGEN, ...).
  reject_if_set(cfg, "num_class_embeds", "class embedding");
  reject_if_set(cfg, "class_embed_type", "class embedding");
  reject_if_set(cfg, "encoder_hid_dim", "encoder hidden-state projection");
  reject_if_set(cfg, "encoder_hid_dim_type", "encoder hidden-state projection");
  reject_if_set(cfg, "time_cond_proj_dim", "timestep condition projection");
  reject_if_set(cfg, "reverse_transformer_layers_per_block", "asymmetric transformer depth");
  reject_if_set(cfg, "cross_attention_norm", "cross-attention norm");
  if (cfg.get<bool>("dual_cross_attention", false))
    cfg.fail("dual_cross_attention", "true is not supported");
  if (cfg.get<std::string>("attention_type", "default") != "default")
    cfg.fail("attention_type",
             "only \"default\" is supported, got " + cfg.json()["attention_type"].dump());
  if (cfg.get<std::string>("time_embedding_type", "positional") != "positional")
    cfg.fail("time_embedding_type",
             "only \"positional\" is supported, got " + cfg.json()["time_embedding_type"].dump());

  c.sample_size = read_size(cfg, "sample_size", kMaxImageSide / 8);  // latent pixels
  c.in_channels = read_int_in(cfg, "in_channels", 4, 1, kMaxConfigDim);
  c.out_channels = read_int_in(cfg, "out_channels", 4, 1, kMaxConfigDim);
  c.center_input_sample = cfg.get<bool>("center_input_sample", false);
  c.flip_sin_to_cos = cfg.get<bool>("flip_sin_to_cos", true);
  c.freq_shift = read_number_in(cfg, "freq_shift", 0.0, -1e6, 1e6);

  c.block_out_channels = read_int_list(cfg, "block_out_channels");
  const size_t n = c.block_out_channels.size();
  c.down_block_types = block_types(
      cfg, "down_block_types",
      {"CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"},
      kDownTypes);
  // A ControlNetModel is the UNet's encoder half: its config has no up path.
  c.encoder_only = cfg.get<std::string>("_class_name", "") == "ControlNetModel";
  if (!c.encoder_only)
    c.up_block_types = block_types(
        cfg, "up_block_types",
        {"UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"}, kUpTypes);
  if (c.down_block_types.size() != n)
    cfg.fail("down_block_types", "has " + std::to_string(c.down_block_types.size()) +
                                     " entries but block_out_channels has " + std::to_string(n));
  if (!c.encoder_only && c.up_block_types.size() != n)
    cfg.fail("up_block_types", "has " + std::to_string(c.up_block_types.size()) +
                                   " entries but block_out_channels has " + std::to_string(n));
  if (cfg.json().contains("mid_block_type") && cfg.json()["mid_block_type"].is_null()) {
    c.mid_block_type = "";
  } else {
    c.mid_block_type = cfg.get<std::string>("mid_block_type", "UNetMidBlock2DCrossAttn");
    if (c.mid_block_type != "UNetMidBlock2DCrossAttn")
      cfg.fail("mid_block_type", "unknown block type '" + c.mid_block_type +
                                     "' (supported: UNetMidBlock2DCrossAttn or null)");
  }

  c.layers_per_block = read_per_block_ints(cfg, "layers_per_block", n, 2, kMaxConfigLayers);
  // diffusers' legacy naming: "attention_head_dim" holds the NUMBER OF HEADS for these blocks
  // (num_attention_heads = num_attention_heads or attention_head_dim). An explicit
  // num_attention_heads takes precedence.
  c.num_attention_heads = cfg.has("num_attention_heads")
                              ? read_per_block_ints(cfg, "num_attention_heads", n, 8)
                              : read_per_block_ints(cfg, "attention_head_dim", n, 8);
  c.cross_attention_dim = read_per_block_ints(cfg, "cross_attention_dim", n, 1280);
  for (auto d : c.cross_attention_dim)
    if (d != c.cross_attention_dim[0])
      cfg.fail("cross_attention_dim",
               "per-block values must be equal (all blocks attend to the same "
               "encoder_hidden_states), got " +
                   cfg.json()["cross_attention_dim"].dump());
  if (cfg.has("transformer_layers_per_block") &&
      cfg.json()["transformer_layers_per_block"].is_array())
    for (const auto& e : cfg.json()["transformer_layers_per_block"])
      if (e.is_array())
        cfg.fail("transformer_layers_per_block", "nested per-layer lists are not supported");
  c.transformer_layers_per_block =
      read_per_block_ints(cfg, "transformer_layers_per_block", n, 1, kMaxConfigLayers);
  c.only_cross_attention = read_per_block_bools(cfg, "only_cross_attention", n, false);

  c.downsample_padding = read_int_in(cfg, "downsample_padding", 1, 0, 64);
  c.mid_block_scale_factor = read_number_in(cfg, "mid_block_scale_factor", 1.0, -1e6, 1e6);
  c.act_fn = cfg.get<std::string>("act_fn", "silu");
  nn::parse_activation(c.act_fn, c.source + ": key 'act_fn'");
  if (cfg.json().contains("norm_num_groups") && cfg.json()["norm_num_groups"].is_null())
    cfg.fail("norm_num_groups", "null (no normalisation) is not supported");
  c.norm_num_groups = read_int_in(cfg, "norm_num_groups", 32, 1, kMaxConfigDim);
  c.norm_eps = read_positive_number(cfg, "norm_eps", 1e-5, 1.0);
  c.use_linear_projection = cfg.get<bool>("use_linear_projection", false);
  c.upcast_attention = cfg.get<bool>("upcast_attention", false);
  c.resnet_time_scale_shift = cfg.get<std::string>("resnet_time_scale_shift", "default");
  if (c.resnet_time_scale_shift != "default" && c.resnet_time_scale_shift != "scale_shift")
    cfg.fail("resnet_time_scale_shift",
             "expected \"default\" or \"scale_shift\", got \"" + c.resnet_time_scale_shift + "\"");
  c.time_embedding_dim =
      read_int_in(cfg, "time_embedding_dim", c.block_out_channels[0] * 4, 1, kMaxConfigDim);
  c.time_embedding_act_fn = cfg.get_optional<std::string>("time_embedding_act_fn");
  if (c.time_embedding_act_fn)
    nn::parse_activation(*c.time_embedding_act_fn, c.source + ": key 'time_embedding_act_fn'");
  c.timestep_post_act = cfg.get_optional<std::string>("timestep_post_act");
  if (c.timestep_post_act)
    nn::parse_activation(*c.timestep_post_act, c.source + ": key 'timestep_post_act'");
  if (cfg.has("addition_embed_type")) {
    const auto type = cfg.get<std::string>("addition_embed_type", "");
    if (type != "text_time")
      cfg.fail("addition_embed_type",
               "only \"text_time\" (SDXL) is supported, got \"" + type + "\"");
    c.text_time = true;
    for (const char* key : {"addition_time_embed_dim", "projection_class_embeddings_input_dim"})
      if (!cfg.has(key)) cfg.fail(key, "required with addition_embed_type \"text_time\"");
    c.addition_time_embed_dim = read_int_in(cfg, "addition_time_embed_dim", 0, 2, kMaxConfigDim);
    c.projection_class_embeddings_input_dim =
        read_int_in(cfg, "projection_class_embeddings_input_dim", 0, 1, kMaxConfigDim);
  }
  c.conv_in_kernel = read_int_in(cfg, "conv_in_kernel", 3, 1, 15);
  c.conv_out_kernel = read_int_in(cfg, "conv_out_kernel", 3, 1, 15);
  if (c.conv_in_kernel % 2 == 0)
    cfg.fail("conv_in_kernel", "must be odd, got " + std::to_string(c.conv_in_kernel));
  if (c.conv_out_kernel % 2 == 0)
    cfg.fail("conv_out_kernel", "must be odd, got " + std::to_string(c.conv_out_kernel));

  // Shape checks that GroupNorm / the head split would otherwise hit mid-forward.
  if (c.norm_num_groups <= 0) cfg.fail("norm_num_groups", "must be positive");
  for (size_t i = 0; i < n; ++i) {
    const int64_t ch = c.block_out_channels[i];
    if (ch % c.norm_num_groups != 0)
      cfg.fail("norm_num_groups", std::to_string(c.norm_num_groups) +
                                      " groups do not divide block_out_channels[" +
                                      std::to_string(i) + "] = " + std::to_string(ch));
  }
  // Down block i, up block n-1-i and (for i = n-1) the mid block attend over
  // block_out_channels[i] channels with num_attention_heads[i] heads.
  for (size_t i = 0; i < n; ++i) {
    bool attends = c.down_block_types[i] == "CrossAttnDownBlock2D" ||
                   (!c.encoder_only && c.up_block_types[n - 1 - i] == "CrossAttnUpBlock2D") ||
                   (i == n - 1 && !c.mid_block_type.empty());
    if (attends && c.block_out_channels[i] % c.num_attention_heads[i] != 0)
      cfg.fail(cfg.has("num_attention_heads") ? "num_attention_heads" : "attention_head_dim",
               std::to_string(c.num_attention_heads[i]) +
                   " heads do not divide block_out_channels[" + std::to_string(i) +
                   "] = " + std::to_string(c.block_out_channels[i]));
  }
  return c;
}

int64_t UNet2DConditionConfig::spatial_factor() const {
  return int64_t{1} << (block_out_channels.size() - 1);
}

}  // namespace diffuse::models
