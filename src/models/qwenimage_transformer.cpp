#include "models/qwenimage_transformer.h"

#include <torch/torch.h>

#include <numeric>

#include "accel/dit_block_loop.h"
#include "accel/dit_cache.h"
#include "diffuse/errors.h"
#include "io/string_affixes.h"
#include "models/config_values.h"
#include "models/load_component.h"
#include "parallel/replicated.h"
#include "parallel/ulysses.h"

namespace diffuse::models {
namespace {

constexpr int64_t kQwenTimestepChannels = 256;
constexpr double kNormEps = 1e-6;
// ComfyUI's single files (and GGUFs converted from them) keep the diffusers names under this.
const std::string kComfyPrefix = "model.diffusion_model.";

}  // namespace

QwenImageTransformerConfig QwenImageTransformerConfig::from_json(const io::JsonConfig& cfg) {
  QwenImageTransformerConfig c;
  c.source = cfg.source();
  c.patch_size = read_int_in(cfg, "patch_size", 2, 1, 64);
  c.in_channels = read_int_in(cfg, "in_channels", 64, 1, kMaxConfigDim);
  c.out_channels = read_int_in(cfg, "out_channels", 16, 1, kMaxConfigDim);
  c.num_layers = read_int_in(cfg, "num_layers", 60, 0, kMaxConfigLayers);
  c.attention_head_dim = read_int_in(cfg, "attention_head_dim", 128, 1, kMaxConfigDim);
  c.num_attention_heads = read_int_in(cfg, "num_attention_heads", 24, 1, kMaxConfigDim);
  if (c.inner_dim() > kMaxConfigDim)
    cfg.fail("num_attention_heads", "the model is wider than any model");
  c.joint_attention_dim = read_int_in(cfg, "joint_attention_dim", 3584, 1, kMaxConfigDim);
  if (cfg.has("axes_dims_rope")) c.axes_dims_rope = read_int_list(cfg, "axes_dims_rope");
  if (c.axes_dims_rope.size() != 3)
    cfg.fail("axes_dims_rope", "expected 3 axes (frame, row, column), got " +
                                   c10::str(c10::IntArrayRef(c.axes_dims_rope)));
  for (auto d : c.axes_dims_rope)
    if (d <= 0 || d % 2 != 0)
      cfg.fail("axes_dims_rope", "every axis needs a positive even number of dimensions, got " +
                                     c10::str(c10::IntArrayRef(c.axes_dims_rope)));
  const int64_t rope_dims =
      std::accumulate(c.axes_dims_rope.begin(), c.axes_dims_rope.end(), int64_t{0});
  if (rope_dims != c.attention_head_dim)
    cfg.fail("axes_dims_rope", c10::str(c10::IntArrayRef(c.axes_dims_rope)) + " sums to " +
                                   std::to_string(rope_dims) + ", but attention_head_dim is " +
                                   std::to_string(c.attention_head_dim));
  if (c.in_channels != c.out_channels * c.patch_size * c.patch_size)
    cfg.fail("in_channels", std::to_string(c.in_channels) +
                                " is not out_channels x patch_size^2 (" +
                                std::to_string(c.out_channels * c.patch_size * c.patch_size) +
                                "): the pipelines pack 2x2 latent patches");
  if (cfg.get<bool>("guidance_embeds", false))
    cfg.fail("guidance_embeds",
             "true is not supported (diffusers' Qwen-Image has no guidance "
             "embedding either)");
  for (const char* key : {"zero_cond_t", "use_additional_t_cond", "use_layer3d_rope"})
    if (cfg.get<bool>(key, false))
      cfg.fail(key, "true (Qwen-Image-Edit-2511 / Qwen-Image-Layered) is not supported yet");
  return c;
}

nn::FluxBlockOptions QwenImageTransformerConfig::block_options() const {
  nn::FluxBlockOptions o;
  o.dim = inner_dim();
  o.heads = num_attention_heads;
  o.head_dim = attention_head_dim;
  o.names = nn::qwen_image_block_names();
  o.clip_image_fp16 = true;
  return o;
}

QwenImageTransformer2DModelImpl::QwenImageTransformer2DModelImpl(QwenImageTransformerConfig config)
    : config_(std::move(config)) {
  const auto& c = config_;
  const int64_t D = c.inner_dim();
  auto tte = register_module("time_text_embed", std::make_shared<torch::nn::Module>());
  timestep_embedder = tte->register_module(
      "timestep_embedder", nn::TimestepEmbedding(kQwenTimestepChannels, D, nn::Activation::kSilu));
  txt_norm = register_module("txt_norm", nn::RMSNorm(c.joint_attention_dim, kNormEps));
  img_in = register_module("img_in", nn::make_linear(c.in_channels, D));
  txt_in = register_module("txt_in", nn::make_linear(c.joint_attention_dim, D));
  auto list = register_module("transformer_blocks", torch::nn::ModuleList());
  const auto bo = c.block_options();
  for (int64_t i = 0; i < c.num_layers; ++i) {
    blocks.push_back(nn::FluxTransformerBlock(bo));
    list->push_back(blocks.back());
  }
  norm_out_linear = register_module("norm_out", std::make_shared<torch::nn::Module>())
                        ->register_module("linear", nn::make_linear(D, 2 * D));
  proj_out =
      register_module("proj_out", nn::make_linear(D, c.patch_size * c.patch_size * c.out_channels));
}

nn::RopeTable qwenimage_rope_table(const std::vector<QwenImageGrid>& img_shapes, int64_t text_len,
                                   const std::vector<int64_t>& axes_dims,
                                   const torch::Device& device) {
  // Positions [S, 3] as float32 (exact small integers): text first, then each image.
  int64_t max_vid = 0, image_tokens = 0;
  for (const auto& g : img_shapes) {
    max_vid = std::max({max_vid, g[1] / 2, g[2] / 2});
    image_tokens += g[0] * g[1] * g[2];
  }
  auto pos = torch::empty({text_len + image_tokens, 3}, torch::kFloat32);
  auto text_pos = torch::arange(max_vid, max_vid + text_len, torch::kFloat32);
  pos.narrow(0, 0, text_len).copy_(text_pos.unsqueeze(1).expand({text_len, 3}));
  int64_t row = text_len;
  for (size_t i = 0; i < img_shapes.size(); ++i) {
    const int64_t f = img_shapes[i][0], h = img_shapes[i][1], w = img_shapes[i][2];
    // Centred rows/columns: -(h - h/2) .. h/2 - 1.
    auto frames =
        torch::arange(static_cast<int64_t>(i), static_cast<int64_t>(i) + f, torch::kFloat32)
            .view({f, 1, 1})
            .expand({f, h, w});
    auto rows =
        torch::arange(-(h - h / 2), h / 2, torch::kFloat32).view({1, h, 1}).expand({f, h, w});
    auto cols =
        torch::arange(-(w - w / 2), w / 2, torch::kFloat32).view({1, 1, w}).expand({f, h, w});
    pos.narrow(0, row, f * h * w).copy_(torch::stack({frames, rows, cols}, -1).reshape({-1, 3}));
    row += f * h * w;
  }
  std::vector<torch::Tensor> angles;
  for (size_t a = 0; a < axes_dims.size(); ++a) {
    const int64_t d = axes_dims[a];
    // rope_params: 1 / theta^(arange(0, d, 2) / d), the outer product, all in float32.
    auto omega =
        1.0 / torch::pow(kQwenImageRopeTheta,
                         torch::arange(0, d, 2, torch::kFloat32).div(static_cast<double>(d)));
    angles.push_back(torch::outer(pos.select(1, static_cast<int64_t>(a)).contiguous(), omega));
  }
  auto angle = torch::cat(angles, 1);
  return {torch::cos(angle).to(device), torch::sin(angle).to(device)};
}

torch::Tensor QwenImageTransformer2DModelImpl::forward(const torch::Tensor& hidden_states,
                                                       const torch::Tensor& timestep,
                                                       const torch::Tensor& encoder_hidden_states,
                                                       const std::vector<QwenImageGrid>& img_shapes,
                                                       const QwenImageForwardOptions& options,
                                                       Intermediates* inter) {
  const auto& c = config_;
  const std::string who = "QwenImageTransformer2DModel: ";
  const auto& x = hidden_states;
  if (!x.defined() || x.dim() != 3 || x.size(0) == 0 || x.size(2) != c.in_channels)
    throw InvalidArgument(who + "hidden_states must be packed tokens [B, S, " +
                          std::to_string(c.in_channels) + "], got " +
                          (x.defined() ? c10::str(x.sizes()) : std::string("none")));
  const int64_t B = x.size(0);
  int64_t grid_tokens = 0;
  for (const auto& g : img_shapes) {
    if (g[0] < 1 || g[1] < 1 || g[2] < 1 || g[1] > 4096 || g[2] > 4096)
      throw InvalidArgument(who + "every image grid needs 1..4096 rows and columns");
    grid_tokens += g[0] * g[1] * g[2];
  }
  if (img_shapes.empty() || grid_tokens != x.size(1))
    throw InvalidArgument(who + "img_shapes describe " + std::to_string(grid_tokens) +
                          " tokens, hidden_states has " + std::to_string(x.size(1)));
  const auto& enc = encoder_hidden_states;
  if (!enc.defined() || enc.dim() != 3 || enc.size(0) != B || enc.size(1) == 0 ||
      enc.size(2) != c.joint_attention_dim)
    throw InvalidArgument(who + "encoder_hidden_states must be [" + std::to_string(B) + ", L, " +
                          std::to_string(c.joint_attention_dim) + "], got " +
                          (enc.defined() ? c10::str(enc.sizes()) : std::string("none")));
  if (!timestep.defined() || (timestep.numel() != 1 && timestep.numel() != B))
    throw InvalidArgument(who + "timestep must hold 1 or " + std::to_string(B) + " values");
  if (options.sequence_group && inter)
    throw InvalidArgument(who +
                          "intermediates are captured on one device, not under sequence "
                          "parallelism");

  const auto dev = img_in->bias.device();
  const auto dtype = img_in->bias.scalar_type();
  std::optional<parallel::UlyssesShard> ulysses;
  nn::FluxBlockInputs in;
  auto tokens_in = x;
  if (options.sequence_group) {
    ulysses.emplace(*options.sequence_group, c.num_attention_heads, x.size(1));
    tokens_in = ulysses->local_rows(x);
    in.ulysses = &*ulysses;
    if (options.cache)
      options.cache->set_rank_sum(parallel::sum_over_ranks(*options.sequence_group));
  }
  auto image = img_in(tokens_in.to(dev, dtype));
  capture(inter, "img_in", image);
  auto text = txt_in(txt_norm(enc.to(dev, dtype)));
  capture(inter, "txt_in", text);
  // The timestep in the model's dtype, then the sinusoid of 1000 * (t * freq) in float32.
  auto t = timestep.to(dev, dtype).reshape({-1}).expand({B});
  in.temb = timestep_embedder(
      nn::get_timestep_embedding(t, kQwenTimestepChannels, /*flip_sin_to_cos=*/true, 0.0, 1000.0)
          .to(dtype));
  capture(inter, "time_text_embed", in.temb);

  const int64_t text_len = text.size(1);
  const auto rope = qwenimage_rope_table(img_shapes, text_len, c.axes_dims_rope, dev);
  in.rope = &rope;

  accel::DitBlockLoop loop;
  loop.dual_blocks = c.num_layers;
  loop.single_blocks = 0;
  loop.dual = [&](int64_t i, const torch::Tensor& img, const torch::Tensor& txt) {
    if (stream) stream->before(static_cast<size_t>(i));
    auto [img_out, txt_out] = blocks[i]->forward(img, txt, in);
    if (stream) stream->after(static_cast<size_t>(i));
    capture(inter, "transformer_blocks." + std::to_string(i) + ".text", txt_out);
    capture(inter, "transformer_blocks." + std::to_string(i) + ".image", img_out);
    return std::make_pair(img_out, txt_out);
  };
  loop.join = [](const torch::Tensor& img, const torch::Tensor& txt) {
    return torch::cat({txt, img}, 1);
  };
  loop.image_of = [&](const torch::Tensor& tokens) {
    return tokens.narrow(1, text_len, tokens.size(1) - text_len);
  };
  loop.single = [](int64_t, const torch::Tensor& tokens) { return tokens; };
  image = accel::run_dit_blocks(loop, options.cache, image, text);

  // AdaLayerNormContinuous: (scale, shift).
  auto mod = norm_out_linear(torch::silu(in.temb)).unsqueeze(1).chunk(2, -1);
  auto normed = nn::layer_norm(image, {}, {}, kNormEps) * (1 + mod[0]) + mod[1];
  capture(inter, "norm_out", normed);
  auto out = proj_out(normed);
  return ulysses ? ulysses->gather_rows(out) : out;
}

bool is_qwenimage_transformer(const io::ModelFolder& folder, const std::string& component) {
  return folder.has_component(component) &&
         folder.component_config(component, "config.json").get<std::string>("_class_name", "") ==
             "QwenImageTransformer2DModel";
}

QwenImageTransformer2DModel load_qwenimage_transformer(const io::ModelFolder& folder,
                                                       torch::Device device, torch::Dtype dtype,
                                                       const std::string& component,
                                                       std::optional<quant::GgmlType> weight_type,
                                                       nn::QuantizedLayers* quantized,
                                                       bool stream) {
  auto cfg = component_config(folder, component, "QwenImageTransformer2DModel");
  QwenImageTransformer2DModel model{nullptr};
  {
    // Every parameter is loaded below; a quantized layer never holds its plain weight.
    nn::SkipInitGuard skip_init(dtype, nn::SkipInitGuard::Weights::kDeferred);
    model = QwenImageTransformer2DModel(QwenImageTransformerConfig::from_json(cfg));
  }
  model->eval();
  if (stream) {
    if (weight_type)
      throw InvalidArgument(
          "weight streaming reads plain weights from their files at every step; not with "
          "quantized weights (--weights)");
    std::vector<std::string> prefixes;
    for (size_t i = 0; i < model->blocks.size(); ++i)
      prefixes.push_back("transformer_blocks." + std::to_string(i) + ".");
    model->stream = load_component_streamed(*model, folder, component, prefixes, device, dtype);
    return model;
  }
  std::vector<std::string> names;
  for (const auto& p : model->named_parameters()) names.push_back(p.key());
  WeightLayoutFor layout_for =
      [names](const std::vector<std::string>& file_keys) -> std::optional<io::WeightLayout> {
    if (file_keys.empty() || !io::starts_with(file_keys.front(), kComfyPrefix)) return std::nullopt;
    io::WeightLayout layout;
    for (const auto& name : names) layout[name] = io::WeightSlice{kComfyPrefix + name};
    return layout;
  };
  load_component_weights_to(*model, folder, component, weight_type, device, dtype, quantized,
                            layout_for);
  return model;
}

}  // namespace diffuse::models
