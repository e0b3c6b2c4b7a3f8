#include "models/unet2d_condition.h"

#include <torch/torch.h>

#include <sstream>

#include "diffuse/errors.h"
#include "models/load_component.h"
#include "nn/fused_ops.h"
#include "nn/layers.h"

namespace diffuse::models {
namespace {

template <typename T>
std::vector<T> reversed(std::vector<T> v) {
  std::reverse(v.begin(), v.end());
  return v;
}

// The down path and mid block, as forward() and a ControlNet's encoder run them: every skip
// connection, and the mid block's output (the down path's without a mid block).
UNetEncoderOutputs run_down_path(std::vector<nn::DownBlock2D>& down_list,
                                 nn::UNetMidBlock2DCrossAttn& mid_block, torch::Tensor sample,
                                 const torch::Tensor& emb, const torch::Tensor& ctx,
                                 Intermediates* intermediates) {
  nn::ResidualStack residuals{sample};
  for (size_t i = 0; i < down_list.size(); ++i) {
    sample = down_list[i](sample, emb, ctx, residuals);
    capture(intermediates, "down_blocks." + std::to_string(i), sample);
  }
  if (mid_block) {
    sample = mid_block(sample, emb, ctx);
    capture(intermediates, "mid_block", sample);
  }
  return {std::move(residuals), sample};
}

}  // namespace

UNet2DConditionModelImpl::UNet2DConditionModelImpl(UNet2DConditionConfig config)
    : config_(std::move(config)) {
  const auto& c = config_;
  act_ = nn::parse_activation(c.act_fn, c.source + ": key 'act_fn'");
  if (c.time_embedding_act_fn)
    time_embed_act_ =
        nn::parse_activation(*c.time_embedding_act_fn, c.source + ": key 'time_embedding_act_fn'");
  std::optional<nn::Activation> post_act;
  if (c.timestep_post_act)
    post_act = nn::parse_activation(*c.timestep_post_act, c.source + ": key 'timestep_post_act'");

  const int64_t n = static_cast<int64_t>(c.block_out_channels.size());
  const auto& boc = c.block_out_channels;
  conv_in = register_module(
      "conv_in", nn::make_conv2d(torch::nn::Conv2dOptions(c.in_channels, boc[0], c.conv_in_kernel)
                                     .padding((c.conv_in_kernel - 1) / 2)));
  time_proj = register_module("time_proj", nn::Timesteps(boc[0], c.flip_sin_to_cos, c.freq_shift));
  time_embedding = register_module(
      "time_embedding", nn::TimestepEmbedding(boc[0], c.time_embedding_dim, act_, post_act));
  if (c.text_time) {
    add_time_proj = register_module(
        "add_time_proj", nn::Timesteps(c.addition_time_embed_dim, c.flip_sin_to_cos, c.freq_shift));
    add_embedding = register_module(
        "add_embedding", nn::TimestepEmbedding(c.projection_class_embeddings_input_dim,
                                               c.time_embedding_dim, act_, std::nullopt));
  }

  nn::UNetBlockOptions base;
  base.temb_channels = c.time_embedding_dim;
  base.resnet_eps = c.norm_eps;
  base.act = act_;
  base.resnet_groups = c.norm_num_groups;
  base.time_embedding_norm = c.resnet_time_scale_shift == "scale_shift"
                                 ? nn::TimeEmbeddingNorm::kScaleShift
                                 : nn::TimeEmbeddingNorm::kDefault;
  base.use_linear_projection = c.use_linear_projection;
  base.upcast_attention = c.upcast_attention;
  base.downsample_padding = c.downsample_padding;

  down_blocks = register_module("down_blocks", torch::nn::ModuleList());
  int64_t output_channel = boc[0];
  for (int64_t i = 0; i < n; ++i) {
    nn::UNetBlockOptions o = base;
    o.in_channels = output_channel;
    o.out_channels = output_channel = boc[i];
    o.num_layers = c.layers_per_block[i];
    o.transformer_layers.assign(o.num_layers, c.transformer_layers_per_block[i]);
    o.num_attention_heads = c.num_attention_heads[i];
    o.cross_attention_dim = c.cross_attention_dim[i];
    o.only_cross_attention = c.only_cross_attention[i];
    o.add_downsample = i < n - 1;
    down_list.emplace_back(o, c.down_block_types[i] == "CrossAttnDownBlock2D");
    down_blocks->push_back(down_list.back());
  }

  if (!c.mid_block_type.empty()) {
    nn::UNetBlockOptions o = base;
    o.in_channels = o.out_channels = boc[n - 1];
    o.num_layers = 1;
    o.transformer_layers = {c.transformer_layers_per_block[n - 1]};
    o.num_attention_heads = c.num_attention_heads[n - 1];
    o.cross_attention_dim = c.cross_attention_dim[n - 1];
    o.output_scale_factor = c.mid_block_scale_factor;
    mid_block = register_module("mid_block", nn::UNetMidBlock2DCrossAttn(o));
  }

  if (c.encoder_only) return;  // a ControlNet: its own modules follow (models/controlnet)
  const auto r_boc = reversed(boc);
  const auto r_layers = reversed(c.layers_per_block);
  const auto r_heads = reversed(c.num_attention_heads);
  const auto r_cross = reversed(c.cross_attention_dim);
  const auto r_tlayers = reversed(c.transformer_layers_per_block);
  const auto r_only_cross = reversed(c.only_cross_attention);
  up_blocks = register_module("up_blocks", torch::nn::ModuleList());
  output_channel = r_boc[0];
  for (int64_t i = 0; i < n; ++i) {
    nn::UNetBlockOptions o = base;
    o.prev_output_channel = output_channel;
    o.out_channels = output_channel = r_boc[i];
    o.in_channels = r_boc[std::min(i + 1, n - 1)];
    o.num_layers = r_layers[i] + 1;
    o.transformer_layers.assign(o.num_layers, r_tlayers[i]);
    o.num_attention_heads = r_heads[i];
    o.cross_attention_dim = r_cross[i];
    o.only_cross_attention = r_only_cross[i];
    o.add_upsample = i < n - 1;
    up_list.emplace_back(o, c.up_block_types[i] == "CrossAttnUpBlock2D");
    up_blocks->push_back(up_list.back());
  }

  // The names token merging selects transformers by (nn::TokenMergeHook).
  const auto name_sites = [](std::vector<nn::Transformer2DModel>& list, const std::string& prefix) {
    for (size_t j = 0; j < list.size(); ++j) list[j]->site = prefix + std::to_string(j);
  };
  for (size_t i = 0; i < down_list.size(); ++i)
    name_sites(down_list[i]->attention_list, "down_blocks." + std::to_string(i) + ".attentions.");
  if (mid_block) name_sites(mid_block->attention_list, "mid_block.attentions.");
  for (size_t i = 0; i < up_list.size(); ++i)
    name_sites(up_list[i]->attention_list, "up_blocks." + std::to_string(i) + ".attentions.");

  conv_norm_out = register_module(
      "conv_norm_out",
      nn::GroupNorm(torch::nn::GroupNormOptions(c.norm_num_groups, boc[0]).eps(c.norm_eps)));
  conv_out = register_module(
      "conv_out",
      nn::make_conv2d(torch::nn::Conv2dOptions(boc[0], c.out_channels, c.conv_out_kernel)
                          .padding((c.conv_out_kernel - 1) / 2)));
}

void UNet2DConditionModelImpl::check_inputs(const torch::Tensor& sample,
                                            const torch::Tensor& timestep,
                                            const torch::Tensor& ehs) const {
  const auto& c = config_;
  const std::string who = "UNet2DConditionModel (" + c.source + "): ";
  if (!sample.defined() || sample.dim() != 4)
    throw InvalidArgument(who + "sample must be 4-D [batch, channels, height, width], got " +
                          (sample.defined() ? c10::str(sample.sizes()) : std::string("no tensor")));
  if (sample.size(1) != c.in_channels)
    throw InvalidArgument(who + "sample has " + std::to_string(sample.size(1)) +
                          " channels, expected in_channels = " + std::to_string(c.in_channels));
  // Any size works: when it is not a multiple of the downsampling factor, the up blocks
  // upsample to the size of the skip connection they meet (diffusers' forward_upsample_size).
  if (sample.size(2) < 1 || sample.size(3) < 1)
    throw InvalidArgument(who + "sample has an empty spatial size " + c10::str(sample.sizes()));
  const int64_t B = sample.size(0);
  if (!timestep.defined() || timestep.dim() > 1 ||
      (timestep.dim() == 1 && timestep.size(0) != 1 && timestep.size(0) != B))
    throw InvalidArgument(who + "timestep must be a scalar or have 1 or batch (" +
                          std::to_string(B) + ") elements, got " +
                          (timestep.defined() ? c10::str(timestep.sizes()) : "no tensor"));
  if (timestep.scalar_type() == torch::kBool || timestep.is_complex())
    throw InvalidArgument(who + "timestep must be an integer or floating-point tensor");
  if (!ehs.defined() || ehs.dim() != 3)
    throw InvalidArgument(who + "encoder_hidden_states must be 3-D [batch, tokens, " +
                          std::to_string(c.cross_attention_dim[0]) + "], got " +
                          (ehs.defined() ? c10::str(ehs.sizes()) : std::string("no tensor")));
  if (ehs.size(2) != c.cross_attention_dim[0])
    throw InvalidArgument(
        who + "encoder_hidden_states has last dimension " + std::to_string(ehs.size(2)) +
        ", expected cross_attention_dim = " + std::to_string(c.cross_attention_dim[0]));
  if (ehs.size(0) != B)
    throw InvalidArgument(who + "encoder_hidden_states has batch " + std::to_string(ehs.size(0)) +
                          ", sample has batch " + std::to_string(B));
}

torch::Tensor UNet2DConditionModelImpl::added_embedding(const UNetAddedConditions* added,
                                                        int64_t batch, const torch::Tensor& like) {
  const auto& c = config_;
  const std::string who = "UNet2DConditionModel (" + c.source + "): ";
  if (!c.text_time) {
    if (added && (added->text_embeds.defined() || added->time_ids.defined()))
      throw InvalidArgument(who +
                            "text_embeds / time_ids given, but this UNet has no added "
                            "conditioning (addition_embed_type unset)");
    return {};
  }
  if (!added || !added->text_embeds.defined() || !added->time_ids.defined())
    throw InvalidArgument(who +
                          "this UNet (addition_embed_type \"text_time\", SDXL) needs the "
                          "pooled text_embeds and the time_ids");
  const auto& te = added->text_embeds;
  const auto& ids = added->time_ids;
  if (te.dim() != 2 || ids.dim() != 2 || te.size(0) != batch || ids.size(0) != batch ||
      te.size(1) + ids.size(1) * c.addition_time_embed_dim !=
          c.projection_class_embeddings_input_dim)
    throw InvalidArgument(
        who + "text_embeds " + c10::str(te.sizes()) + " and time_ids " + c10::str(ids.sizes()) +
        " do not fit: expected [" + std::to_string(batch) + ", P] and [" + std::to_string(batch) +
        ", K] with P + K x addition_time_embed_dim (" + std::to_string(c.addition_time_embed_dim) +
        ") = projection_class_embeddings_input_dim (" +
        std::to_string(c.projection_class_embeddings_input_dim) + ")");
  // As diffusers: the ids' sinusoids in float32, concatenated after the pooled embedding, then
  // in the model's dtype.
  const auto time_embeds = add_time_proj(ids.to(like.device()).flatten()).reshape({batch, -1});
  const auto add_embeds =
      torch::cat({te.to(like.device(), time_embeds.scalar_type()), time_embeds}, -1)
          .to(like.scalar_type());
  return add_embedding(add_embeds);
}

UNet2DConditionModelImpl::Prepared UNet2DConditionModelImpl::prepare(
    const torch::Tensor& sample_in, const torch::Tensor& timestep,
    const torch::Tensor& encoder_hidden_states, Intermediates* intermediates,
    const UNetAddedConditions* added) {
  check_inputs(sample_in, timestep, encoder_hidden_states);
  const int64_t B = sample_in.size(0);
  // Inputs follow the model's device and compute dtype (a no-op when they already match).
  const auto& w = nn::compute_reference(*conv_in);
  auto sample = sample_in.to(w.device(), w.scalar_type());
  if (config_.center_input_sample) sample = 2 * sample - 1.0;

  // Time embedding: sinusoidal in float32 (as diffusers), then cast to the model's dtype.
  auto t = timestep.to(sample.device());
  if (t.dim() == 0) t = t.unsqueeze(0);
  auto t_emb = time_proj(t.expand({B})).to(sample.scalar_type());
  capture(intermediates, "time_proj", t_emb);
  auto emb = time_embedding(t_emb);
  capture(intermediates, "time_embedding", emb);
  if (const auto aug = added_embedding(added, B, t_emb); aug.defined()) {
    capture(intermediates, "add_embedding", aug);
    emb = emb + aug;
  }
  if (time_embed_act_) emb = nn::apply_activation(emb, *time_embed_act_);

  const auto ctx = encoder_hidden_states.to(w.device(), w.scalar_type());
  sample = conv_in(sample);
  capture(intermediates, "conv_in", sample);
  return {sample, emb, ctx};
}

torch::Tensor UNet2DConditionModelImpl::output_head(torch::Tensor sample,
                                                    Intermediates* intermediates) {
  sample = conv_norm_out(sample);
  capture(intermediates, "conv_norm_out", sample);
  // NCHW out whatever layout the last level ran in: callers get the layout they passed in.
  return conv_out(nn::apply_activation(sample, act_)).contiguous();
}

torch::Tensor UNet2DConditionModelImpl::forward(const torch::Tensor& sample_in,
                                                const torch::Tensor& timestep,
                                                const torch::Tensor& encoder_hidden_states,
                                                Intermediates* intermediates,
                                                const UNetAddedConditions* added,
                                                const UNetControlResiduals* control) {
  if (config_.encoder_only)
    throw InvalidArgument("UNet2DConditionModel (" + config_.source +
                          "): a ControlNet's encoder has no up path to run forward() on");
  auto [prepared, emb, ctx] =
      prepare(sample_in, timestep, encoder_hidden_states, intermediates, added);
  auto [residuals, sample] = run_down_path(down_list, mid_block, prepared, emb, ctx, intermediates);
  if (control) {
    const std::string who = "UNet2DConditionModel (" + config_.source + "): ControlNet ";
    if (control->down.size() != residuals.size())
      throw InvalidArgument(who + "gives " + std::to_string(control->down.size()) +
                            " down-block residuals, the UNet has " +
                            std::to_string(residuals.size()) +
                            " skip connections: the ControlNet's block layout does not fit");
    for (size_t i = 0; i < residuals.size(); ++i) {
      if (control->down[i].sizes() != residuals[i].sizes())
        throw InvalidArgument(who + "residual " + std::to_string(i) + " has shape " +
                              c10::str(control->down[i].sizes()) + ", the UNet's skip has " +
                              c10::str(residuals[i].sizes()));
      residuals[i] = residuals[i] + control->down[i].to(residuals[i].scalar_type());
    }
    if (control->mid.defined()) {
      if (control->mid.sizes() != sample.sizes())
        throw InvalidArgument(who + "mid residual has shape " + c10::str(control->mid.sizes()) +
                              ", the UNet's mid block gives " + c10::str(sample.sizes()));
      sample = sample + control->mid.to(sample.scalar_type());
    }
  }
  for (size_t i = 0; i < up_list.size(); ++i) {
    sample = up_list[i](sample, residuals, emb, ctx);
    capture(intermediates, "up_blocks." + std::to_string(i), sample);
  }
  return output_head(sample, intermediates);
}

UNetEncoderOutputs UNet2DConditionModelImpl::forward_encoder(
    const torch::Tensor& sample_in, const torch::Tensor& timestep,
    const torch::Tensor& encoder_hidden_states,
    const std::function<torch::Tensor(const torch::Tensor&)>& hint, Intermediates* intermediates,
    const UNetAddedConditions* added) {
  auto [sample, emb, ctx] =
      prepare(sample_in, timestep, encoder_hidden_states, intermediates, added);
  if (hint) sample = sample + hint(sample);
  return run_down_path(down_list, mid_block, sample, emb, ctx, intermediates);
}

UNet2DConditionModel load_unet(const io::ModelFolder& folder, torch::Device device,
                               torch::Dtype dtype, const std::string& component) {
  auto cfg = component_config(folder, component, "UNet2DConditionModel");
  UNet2DConditionModel model{nullptr};
  {
    nn::SkipInitGuard skip_init(dtype);  // every parameter is loaded below
    model = UNet2DConditionModel(UNet2DConditionConfig::from_json(cfg));
  }
  load_component_weights(*model, folder, component);
  model->to(device, dtype);
  nn::use_compute_layout(*model);
  model->eval();
  return model;
}

}  // namespace diffuse::models
