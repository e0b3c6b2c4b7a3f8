#include "models/flux_transformer.h"

#include <torch/torch.h>

#include <numeric>

#include "accel/dit_block_loop.h"
#include "accel/dit_cache.h"
#include "diffuse/errors.h"
#include "models/config_values.h"
#include "models/flux_bfl_names.h"
#include "models/load_component.h"
#include "nn/fused_ops.h"
#include "nn/rope.h"
#include "parallel/replicated.h"
#include "parallel/ulysses.h"

namespace diffuse::models {
namespace {

constexpr int64_t kFluxTimestepChannels = 256;

// An attribute-only module level of diffusers' tree (time_text_embed, norm_out).
std::shared_ptr<torch::nn::Module> module_level(torch::nn::Module& parent,
                                                const std::string& name) {
  return parent.register_module(name, std::make_shared<torch::nn::Module>());
}

std::string shape_text(const torch::Tensor& t) {
  return c10::str(t.sizes());
}

// [N, 3] from [N, 3] or [1, N, 3] (diffusers accepts the 3-d form with a deprecation warning).
torch::Tensor ids_2d(const torch::Tensor& ids) {
  return ids.dim() == 3 ? ids.select(0, 0) : ids;
}

}  // namespace

FluxTransformerConfig FluxTransformerConfig::from_json(const io::JsonConfig& cfg) {
  FluxTransformerConfig c;
  c.source = cfg.source();
  c.patch_size = read_int_in(cfg, "patch_size", 1, 1, 64);
  c.in_channels = read_int_in(cfg, "in_channels", 64, 1, kMaxConfigDim);
  c.out_channels = read_int_in(cfg, "out_channels", c.in_channels, 1, kMaxConfigDim);
  c.num_layers = read_int_in(cfg, "num_layers", 19, 0, kMaxConfigLayers);
  c.num_single_layers = read_int_in(cfg, "num_single_layers", 38, 0, kMaxConfigLayers);
  c.attention_head_dim = read_int_in(cfg, "attention_head_dim", 128, 1, kMaxConfigDim);
  c.num_attention_heads = read_int_in(cfg, "num_attention_heads", 24, 1, kMaxConfigDim);
  if (c.inner_dim() > kMaxConfigDim)
    cfg.fail("num_attention_heads", std::to_string(c.num_attention_heads) + " heads x " +
                                        std::to_string(c.attention_head_dim) +
                                        " dimensions is wider than any model");
  c.joint_attention_dim = read_int_in(cfg, "joint_attention_dim", 4096, 1, kMaxConfigDim);
  c.pooled_projection_dim = read_int_in(cfg, "pooled_projection_dim", 768, 1, kMaxConfigDim);
  c.guidance_embeds = cfg.get<bool>("guidance_embeds", false);
  if (cfg.has("axes_dims_rope")) c.axes_dims_rope = read_int_list(cfg, "axes_dims_rope");
  if (c.axes_dims_rope.empty()) cfg.fail("axes_dims_rope", "needs at least one axis, got []");
  for (auto d : c.axes_dims_rope)
    if (d <= 0 || d % 2 != 0)
      cfg.fail("axes_dims_rope", "every axis needs a positive even number of dimensions, got " +
                                     c10::str(c10::IntArrayRef(c.axes_dims_rope)));
  const int64_t rope_dims =
      std::accumulate(c.axes_dims_rope.begin(), c.axes_dims_rope.end(), int64_t{0});
  if (rope_dims != c.attention_head_dim)
    cfg.fail("axes_dims_rope", c10::str(c10::IntArrayRef(c.axes_dims_rope)) + " sums to " +
                                   std::to_string(rope_dims) + ", but attention_head_dim is " +
                                   std::to_string(c.attention_head_dim) +
                                   " (FLUX rotates the whole head)");
  return c;
}

nn::FluxBlockOptions FluxTransformerConfig::block_options() const {
  nn::FluxBlockOptions o;
  o.dim = inner_dim();
  o.heads = num_attention_heads;
  o.head_dim = attention_head_dim;
  return o;
}

FluxTransformer2DModelImpl::FluxTransformer2DModelImpl(FluxTransformerConfig config)
    : config_(std::move(config)) {
  const auto& c = config_;
  const int64_t D = c.inner_dim();
  auto tte = module_level(*this, "time_text_embed");
  time_proj = tte->register_module(
      "time_proj", nn::Timesteps(kFluxTimestepChannels, /*flip_sin_to_cos=*/true, 0.0));
  timestep_embedder = tte->register_module(
      "timestep_embedder", nn::TimestepEmbedding(kFluxTimestepChannels, D, nn::Activation::kSilu));
  if (c.guidance_embeds)
    guidance_embedder = tte->register_module(
        "guidance_embedder",
        nn::TimestepEmbedding(kFluxTimestepChannels, D, nn::Activation::kSilu));
  // PixArtAlphaTextProjection(act "silu"): the same linear_1, SiLU, linear_2.
  text_embedder = tte->register_module(
      "text_embedder", nn::TimestepEmbedding(c.pooled_projection_dim, D, nn::Activation::kSilu));
  context_embedder = register_module("context_embedder", nn::make_linear(c.joint_attention_dim, D));
  x_embedder = register_module("x_embedder", nn::make_linear(c.in_channels, D));

  const auto bo = c.block_options();
  auto doubles = register_module("transformer_blocks", torch::nn::ModuleList());
  for (int64_t i = 0; i < c.num_layers; ++i) {
    double_blocks.push_back(nn::FluxTransformerBlock(bo));
    doubles->push_back(double_blocks.back());
  }
  auto singles = register_module("single_transformer_blocks", torch::nn::ModuleList());
  for (int64_t i = 0; i < c.num_single_layers; ++i) {
    single_blocks.push_back(nn::FluxSingleTransformerBlock(bo));
    singles->push_back(single_blocks.back());
  }
  norm_out_linear =
      module_level(*this, "norm_out")->register_module("linear", nn::make_linear(D, 2 * D));
  proj_out =
      register_module("proj_out", nn::make_linear(D, c.patch_size * c.patch_size * c.out_channels));
}

void FluxTransformer2DModelImpl::check_inputs(const torch::Tensor& x, const torch::Tensor& timestep,
                                              const torch::Tensor& enc, const torch::Tensor& pooled,
                                              const torch::Tensor& img_ids,
                                              const torch::Tensor& txt_ids,
                                              const torch::Tensor& guidance) const {
  const auto& c = config_;
  const std::string who = "FluxTransformer2DModel: ";
  if (!x.defined() || x.dim() != 3 || x.size(0) == 0 || x.size(1) == 0 ||
      x.size(2) != c.in_channels)
    throw InvalidArgument(who + "hidden_states must be packed tokens [B, S, " +
                          std::to_string(c.in_channels) + "], got " +
                          (x.defined() ? shape_text(x) : std::string("none")));
  const int64_t B = x.size(0), S = x.size(1);
  const auto one_or_batch = [&](const torch::Tensor& t, const char* name) {
    if (!t.defined() || (t.numel() != 1 && t.numel() != B))
      throw InvalidArgument(who + name + " must hold 1 or " + std::to_string(B) + " values, got " +
                            (t.defined() ? shape_text(t) : std::string("none")));
  };
  one_or_batch(timestep, "timestep");
  if (c.guidance_embeds)
    one_or_batch(guidance, "guidance (this model embeds the guidance scale: guidance_embeds)");
  else if (guidance.defined())
    throw InvalidArgument(who + "this model has no guidance embedding (guidance_embeds false in " +
                          c.source + "); pass no guidance");
  if (!enc.defined() || enc.dim() != 3 || enc.size(0) != B || enc.size(2) != c.joint_attention_dim)
    throw InvalidArgument(who + "encoder_hidden_states must be [" + std::to_string(B) + ", L, " +
                          std::to_string(c.joint_attention_dim) + "], got " +
                          (enc.defined() ? shape_text(enc) : std::string("none")));
  if (!pooled.defined() || pooled.dim() != 2 || pooled.size(0) != B ||
      pooled.size(1) != c.pooled_projection_dim)
    throw InvalidArgument(who + "pooled_projections must be [" + std::to_string(B) + ", " +
                          std::to_string(c.pooled_projection_dim) + "], got " +
                          (pooled.defined() ? shape_text(pooled) : std::string("none")));
  const auto axes = static_cast<int64_t>(c.axes_dims_rope.size());
  const auto check_ids = [&](const torch::Tensor& ids, int64_t n, const char* name) {
    const bool ok =
        ids.defined() &&
        ((ids.dim() == 2 && ids.size(0) == n && ids.size(1) == axes) ||
         (ids.dim() == 3 && ids.size(0) >= 1 && ids.size(1) == n && ids.size(2) == axes));
    if (!ok)
      throw InvalidArgument(who + name + " must be [" + std::to_string(n) + ", " +
                            std::to_string(axes) +
                            "] (one position per token and rope axis), got " +
                            (ids.defined() ? shape_text(ids) : std::string("none")));
  };
  check_ids(img_ids, S, "img_ids");
  check_ids(txt_ids, enc.size(1), "txt_ids");
}

torch::Tensor FluxTransformer2DModelImpl::forward(
    const torch::Tensor& hidden_states, const torch::Tensor& timestep,
    const torch::Tensor& encoder_hidden_states, const torch::Tensor& pooled,
    const torch::Tensor& img_ids, const torch::Tensor& txt_ids, const torch::Tensor& guidance,
    const FluxForwardOptions& options, Intermediates* inter) {
  check_inputs(hidden_states, timestep, encoder_hidden_states, pooled, img_ids, txt_ids, guidance);
  const auto& c = config_;
  const auto dev = x_embedder->bias.device();
  const auto dtype = x_embedder->bias.scalar_type();
  const int64_t B = hidden_states.size(0);

  if (options.sequence_group && inter)
    throw InvalidArgument(
        "FluxTransformer2DModel: intermediates are captured on one device, not under sequence "
        "parallelism");
  // Ulysses: this rank embeds and carries its share of the image tokens.
  std::optional<parallel::UlyssesShard> ulysses;
  nn::FluxBlockInputs in;
  auto tokens_in = hidden_states;
  if (options.sequence_group) {
    ulysses.emplace(*options.sequence_group, c.num_attention_heads, hidden_states.size(1));
    tokens_in = ulysses->local_rows(hidden_states);
    in.ulysses = &*ulysses;
    if (options.cache)
      options.cache->set_rank_sum(parallel::sum_over_ranks(*options.sequence_group));
  }
  auto image = x_embedder(tokens_in.to(dev, dtype));
  capture(inter, "x_embedder", image);

  // diffusers rounds t * 1000 (and guidance * 1000) in the model's dtype before the sinusoidal
  // embedding, which then runs in float32 and is cast back.
  const auto embed = [&](nn::TimestepEmbedding& mlp, const torch::Tensor& t) {
    auto scaled = t.to(dev, dtype).reshape({-1}).expand({B}) * 1000;
    return mlp(time_proj(scaled).to(dtype));
  };
  in.temb = embed(timestep_embedder, timestep);
  if (c.guidance_embeds) in.temb = in.temb + embed(guidance_embedder, guidance);
  in.temb = in.temb + text_embedder(pooled.to(dev, dtype));
  capture(inter, "time_text_embed", in.temb);

  auto text = context_embedder(encoder_hidden_states.to(dev, dtype));
  capture(inter, "context_embedder", text);
  const int64_t text_len = text.size(1);

  const auto rope =
      nn::rope_table(torch::cat({ids_2d(txt_ids), ids_2d(img_ids)}, 0).to(torch::kCPU),
                     c.axes_dims_rope, kFluxRopeTheta, dev);
  in.rope = &rope;
  if (inter) {
    // diffusers' layout: each angle's cos/sin repeated for both members of its pair.
    capture(inter, "pos_embed.cos", rope.cos.repeat_interleave(2, 1));
    capture(inter, "pos_embed.sin", rope.sin.repeat_interleave(2, 1));
  }

  // The joint sequence is [text | image]; a cache may skip some or all blocks.
  accel::DitBlockLoop loop;
  loop.dual_blocks = c.num_layers;
  loop.single_blocks = c.num_single_layers;
  loop.dual = [&](int64_t i, const torch::Tensor& img, const torch::Tensor& txt) {
    if (stream) stream->before(static_cast<size_t>(i));
    auto [img_out, txt_out] = double_blocks[i]->forward(img, txt, in);
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
  loop.single = [&](int64_t j, const torch::Tensor& tokens) {
    if (stream) stream->before(static_cast<size_t>(c.num_layers + j));
    auto out = single_blocks[j]->forward(tokens, in);
    if (stream) stream->after(static_cast<size_t>(c.num_layers + j));
    if (inter) {
      capture(inter, "single_transformer_blocks." + std::to_string(j) + ".text",
              out.narrow(1, 0, text_len));
      capture(inter, "single_transformer_blocks." + std::to_string(j) + ".image",
              loop.image_of(out));
    }
    return out;
  };
  image = accel::run_dit_blocks(loop, options.cache, image, text);

  // AdaLayerNormContinuous: the chunks come in the order (scale, shift).
  auto mod = norm_out_linear(torch::silu(in.temb)).unsqueeze(1).chunk(2, -1);
  auto normed = nn::layer_norm(image, {}, {}, nn::kFluxNormEps) * (1 + mod[0]) + mod[1];
  capture(inter, "norm_out", normed);
  auto out = proj_out(normed);
  return ulysses ? ulysses->gather_rows(out) : out;
}

FluxTransformer2DModel load_flux_transformer(const io::ModelFolder& folder, torch::Device device,
                                             torch::Dtype dtype, const std::string& component,
                                             std::optional<quant::GgmlType> weight_type,
                                             nn::QuantizedLayers* quantized, bool stream) {
  auto cfg = component_config(folder, component, "FluxTransformer2DModel");
  FluxTransformer2DModel model{nullptr};
  {
    // Every parameter is loaded below; a quantized layer never holds its plain weight.
    nn::SkipInitGuard skip_init(dtype, nn::SkipInitGuard::Weights::kDeferred);
    model = FluxTransformer2DModel(FluxTransformerConfig::from_json(cfg));
  }
  model->eval();
  if (stream) {
    if (weight_type)
      throw InvalidArgument(
          "weight streaming reads plain weights from their files at every step; not with "
          "quantized weights (--weights)");
    std::vector<std::string> prefixes;
    for (size_t i = 0; i < model->double_blocks.size(); ++i)
      prefixes.push_back("transformer_blocks." + std::to_string(i) + ".");
    for (size_t i = 0; i < model->single_blocks.size(); ++i)
      prefixes.push_back("single_transformer_blocks." + std::to_string(i) + ".");
    model->stream = load_component_streamed(*model, folder, component, prefixes, device, dtype);
    return model;
  }
  // Diffusers names, or BFL's original ones (flux1-dev.safetensors, ComfyUI, city96's GGUFs).
  load_component_weights_to(*model, folder, component, weight_type, device, dtype, quantized,
                            flux_weight_layout_for(model->config()));
  return model;
}

torch::Tensor flux_pack(const torch::Tensor& latents) {
  if (latents.dim() != 4 || latents.size(2) % 2 != 0 || latents.size(3) % 2 != 0)
    throw InvalidArgument("flux_pack: latents must be [B, C, h, w] with even h and w, got " +
                          shape_text(latents));
  const int64_t B = latents.size(0), C = latents.size(1), h = latents.size(2), w = latents.size(3);
  return latents.view({B, C, h / 2, 2, w / 2, 2})
      .permute({0, 2, 4, 1, 3, 5})
      .reshape({B, (h / 2) * (w / 2), C * 4});
}

torch::Tensor flux_unpack(const torch::Tensor& tokens, int64_t h, int64_t w) {
  if (tokens.dim() != 3 || h % 2 != 0 || w % 2 != 0 || tokens.size(1) != (h / 2) * (w / 2) ||
      tokens.size(2) % 4 != 0)
    throw InvalidArgument("flux_unpack: tokens " + shape_text(tokens) + " do not pack a " +
                          std::to_string(h) + "x" + std::to_string(w) + " latent");
  const int64_t B = tokens.size(0), C = tokens.size(2) / 4;
  return tokens.view({B, h / 2, w / 2, C, 2, 2}).permute({0, 3, 1, 4, 2, 5}).reshape({B, C, h, w});
}

torch::Tensor flux_image_ids(int64_t h, int64_t w, float frame) {
  const int64_t rows = h / 2, cols = w / 2;
  auto r = torch::arange(rows, torch::kFloat32).view({rows, 1}).expand({rows, cols});
  auto c = torch::arange(cols, torch::kFloat32).view({1, cols}).expand({rows, cols});
  return torch::stack({torch::full({rows, cols}, frame, torch::kFloat32), r, c}, -1)
      .reshape({rows * cols, 3});
}

}  // namespace diffuse::models
