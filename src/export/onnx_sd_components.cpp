// The Stable Diffusion components as ONNX graphs: UNet2DConditionModel (SD 1.x/2.x, inpainting,
// SDXL's text_time conditioning), AutoencoderKL's decoder and encoder, CLIP text encoders.
#include <torch/torch.h>

#include <cmath>
#include <limits>

#include "diffuse/errors.h"
#include "export/onnx_components.h"
#include "export/onnx_modules.h"
#include "io/model_folder.h"
#include "models/autoencoder_kl.h"
#include "models/clip_text_model.h"
#include "models/controlnet.h"
#include "models/unet2d_condition.h"

namespace diffuse::onnx_export {
namespace {

// The pooled width and the number of time ids of an SDXL UNet's added conditioning.
std::pair<int64_t, int64_t> sdxl_added_sizes(const io::ModelFolder& folder,
                                             const models::UNet2DConditionConfig& c) {
  int64_t pooled = 0;
  for (const char* te : {"text_encoder_2", "text_encoder"}) {
    if (!folder.has_component(te)) continue;
    const auto tc = models::clip_text_config(folder, te);
    if (tc.with_projection) {
      pooled = tc.projection_dim;
      break;
    }
  }
  const int64_t rest = c.projection_class_embeddings_input_dim - pooled;
  if (pooled == 0 || c.addition_time_embed_dim <= 0 || rest <= 0 ||
      rest % c.addition_time_embed_dim != 0)
    throw InvalidArgument(
        "ONNX export of " + c.source +
        ": cannot tell the sizes of text_embeds and time_ids "
        "(projection_class_embeddings_input_dim " +
        std::to_string(c.projection_class_embeddings_input_dim) +
        " is not the projected text encoder's width plus a whole number of time ids)");
  return {pooled, rest / c.addition_time_embed_dim};
}
Value write_vae_mid_and_blocks(ModuleWriter& w, nn::UNetMidBlock2DImpl& mid,
                               const std::string& name, Value x) {
  x = w.resnet(*mid.resnet_list[0], name + ".resnets.0", x);
  for (size_t j = 1; j < mid.resnet_list.size(); ++j) {
    if (!mid.attention_list.empty())
      x = w.spatial_attention(*mid.attention_list[j - 1],
                              name + ".attentions." + std::to_string(j - 1), x);
    x = w.resnet(*mid.resnet_list[j], name + ".resnets." + std::to_string(j), x);
  }
  return x;
}

// The inputs every UNet-shaped graph takes (the UNet's and a ControlNet's): sample,
// timestep, encoder_hidden_states, and SDXL's text_embeds and time_ids.
struct UNetInputs {
  std::vector<Dim> sample_dims;
  Value sample, timestep, context, text_embeds, time_ids;
  int64_t time_id_count = 0;
};

UNetInputs unet_inputs(const ExportRequest& r, const io::ModelFolder& folder,
                       const models::UNet2DConditionConfig& c, int64_t height, int64_t width,
                       int64_t factor, Io& io, torch::Dtype dtype) {
  const Shapes s{r.dynamic};
  const auto B = s.dim(r.batch, "batch");
  const int64_t tokens = r.tokens > 0 ? r.tokens : 77;
  UNetInputs in;
  in.sample_dims = {B, c.in_channels, s.dim(height / factor, "height"),
                    s.dim(width / factor, "width")};
  in.sample = io.in("sample", dtype, in.sample_dims);
  in.timestep = io.in("timestep", torch::kFloat32, {B});
  in.context = io.in("encoder_hidden_states", dtype,
                     {B, s.dim(tokens, "sequence"), c.cross_attention_dim[0]});
  if (c.text_time) {
    int64_t pooled = 0;
    std::tie(pooled, in.time_id_count) = sdxl_added_sizes(folder, c);
    in.text_embeds = io.in("text_embeds", dtype, {B, pooled});
    in.time_ids = io.in("time_ids", dtype, {B, in.time_id_count});
  }
  return in;
}

// The time embedding (SDXL's added conditioning included), as UNet2DConditionModel::prepare.
Value unet_time_embedding(ModuleWriter& w, models::UNet2DConditionModelImpl& m,
                          const UNetInputs& in, torch::Dtype dtype) {
  auto& g = w.graph();
  const auto& c = m.config();
  g.set_scope("time_embedding");
  auto emb = w.timestep_embedding(*m.time_embedding, "time_embedding",
                                  g.cast(w.timesteps(*m.time_proj, in.timestep), dtype));
  if (c.text_time) {
    g.set_scope("add_embedding");
    const auto flat = g.op("Reshape", {g.cast(in.time_ids, torch::kFloat32), g.ints({-1}, "flat")});
    const auto time_embeds =
        g.op("Reshape", {w.timesteps(*m.add_time_proj, flat),
                         g.ints({-1, in.time_id_count * c.addition_time_embed_dim}, "rows")});
    const auto add = g.op("Concat", {g.cast(in.text_embeds, torch::kFloat32), time_embeds},
                          {{"axis", int64_t{-1}}});
    emb = g.op("Add",
               {emb, w.timestep_embedding(*m.add_embedding, "add_embedding", g.cast(add, dtype))});
  }
  if (c.time_embedding_act_fn)
    emb = w.activation(nn::parse_activation(*c.time_embedding_act_fn, c.source), emb);
  return emb;
}

Value unet_conv_in(ModuleWriter& w, models::UNet2DConditionModelImpl& m, Value x) {
  auto& g = w.graph();
  g.set_scope("conv_in");
  if (m.config().center_input_sample)
    x = g.op("Sub", {g.op("Mul", {x, g.scalar(2.0, "two")}), g.scalar(1.0, "one")});
  return w.conv(*m.conv_in, "conv_in", x);
}

// The down path and the mid block, as UNet2DConditionModel's run_down_path: every skip
// connection in order, and the mid block's output (the down path's when there is none).
std::pair<std::vector<Value>, Value> unet_down_path(ModuleWriter& w,
                                                    models::UNet2DConditionModelImpl& m, Value x,
                                                    const Value& emb, const Value& context) {
  std::vector<Value> residuals{x};
  for (size_t i = 0; i < m.down_list.size(); ++i) {
    auto& block = *m.down_list[i];
    const auto name = "down_blocks." + std::to_string(i);
    for (size_t j = 0; j < block.resnet_list.size(); ++j) {
      x = w.resnet(*block.resnet_list[j], name + ".resnets." + std::to_string(j), x, emb);
      if (block.has_cross_attention)
        x = w.transformer_2d(*block.attention_list[j], name + ".attentions." + std::to_string(j), x,
                             context);
      residuals.push_back(x);
    }
    if (block.downsampler) {
      x = w.downsample(*block.downsampler, name + ".downsamplers.0", x);
      residuals.push_back(x);
    }
  }
  if (m.mid_block) {
    auto& mid = *m.mid_block;
    x = w.resnet(*mid.resnet_list[0], "mid_block.resnets.0", x, emb);
    for (size_t j = 0; j < mid.attention_list.size(); ++j) {
      x = w.transformer_2d(*mid.attention_list[j], "mid_block.attentions." + std::to_string(j), x,
                           context);
      x = w.resnet(*mid.resnet_list[j + 1], "mid_block.resnets." + std::to_string(j + 1), x, emb);
    }
  }
  return {residuals, x};
}

// The shapes of the skip connections (and, last, the mid block's output) of a UNet-shaped
// network at `sample_dims`: channels from its blocks, each stride-2 downsampler taking the
// latent to ceil(size / 2); symbols "height_dN" / "width_dN" for level N under --dynamic.
std::vector<std::vector<Dim>> skip_shapes(models::UNet2DConditionModelImpl& m,
                                          const std::vector<Dim>& sample_dims, bool dynamic) {
  const auto& c = m.config();
  const auto level_dims = [&](int64_t channels, int level) {
    std::vector<Dim> d{sample_dims[0], channels};
    for (size_t axis = 2; axis < 4; ++axis) {
      if (dynamic) {
        d.push_back(level == 0 ? sample_dims[axis]
                               : Dim((axis == 2 ? "height_d" : "width_d") + std::to_string(level)));
      } else {
        int64_t size = std::get<int64_t>(sample_dims[axis]);
        for (int l = 0; l < level; ++l) size = (size + 1) / 2;
        d.push_back(size);
      }
    }
    return d;
  };
  std::vector<std::vector<Dim>> out{level_dims(c.block_out_channels[0], 0)};
  int level = 0;
  for (size_t i = 0; i < m.down_list.size(); ++i) {
    const int64_t ch = c.block_out_channels[i];
    for (size_t j = 0; j < m.down_list[i]->resnet_list.size(); ++j)
      out.push_back(level_dims(ch, level));
    if (m.down_list[i]->downsampler) out.push_back(level_dims(ch, ++level));
  }
  out.push_back(level_dims(c.block_out_channels.back(), level));
  return out;
}

}  // namespace

void write_unet(const ExportRequest& r, const io::ModelFolder& folder, OnnxGraph& g,
                ExportResult& result) {
  const auto dtype = g.compute_dtype();
  const int64_t factor = vae_factor(folder);
  const auto [height, width] = image_size(r, folder, factor);
  auto unet = models::load_unet(folder, torch::kCPU, torch::kFloat32);
  auto& m = *unet;
  const auto& c = m.config();
  Io io{g, result};
  ModuleWriter w(g);
  const auto in = unet_inputs(r, folder, c, height, width, factor, io, dtype);
  const auto& sample_dims = in.sample_dims;
  const auto& context = in.context;
  // A ControlNet's residuals as inputs (--control-residuals), added to the skips and the mid
  // block's output as UNet2DConditionModel::forward does with UNetControlResiduals.
  std::vector<Value> control;
  if (r.control_residuals) {
    const auto shapes = skip_shapes(m, sample_dims, r.dynamic);
    for (size_t i = 0; i + 1 < shapes.size(); ++i)
      control.push_back(
          io.in("down_block_additional_residuals." + std::to_string(i), dtype, shapes[i]));
    control.push_back(io.in("mid_block_additional_residual", dtype, shapes.back()));
  }

  const auto act = nn::parse_activation(c.act_fn, c.source);
  const auto emb = unet_time_embedding(w, m, in, dtype);
  auto [residuals, x] = unet_down_path(w, m, unet_conv_in(w, m, in.sample), emb, context);
  if (!control.empty()) {
    g.set_scope("control_residuals");
    for (size_t i = 0; i < residuals.size(); ++i)
      residuals[i] = g.op("Add", {residuals[i], control[i]});
    x = g.op("Add", {x, control.back()});
  }
  for (size_t i = 0; i < m.up_list.size(); ++i) {
    auto& block = *m.up_list[i];
    const auto name = "up_blocks." + std::to_string(i);
    for (size_t j = 0; j < block.resnet_list.size(); ++j) {
      if (residuals.empty()) throw Error("ONNX export: the UNet's up path ran out of skips");
      const auto skip = residuals.back();
      residuals.pop_back();
      g.set_scope(name);
      x = g.op("Concat", {x, skip}, {{"axis", int64_t{1}}});
      x = w.resnet(*block.resnet_list[j], name + ".resnets." + std::to_string(j), x, emb);
      if (block.has_cross_attention)
        x = w.transformer_2d(*block.attention_list[j], name + ".attentions." + std::to_string(j), x,
                             context);
    }
    if (block.upsampler)
      x = w.upsample(*block.upsampler, name + ".upsamplers.0", x,
                     residuals.empty() ? Value() : residuals.back());
  }
  g.set_scope("conv_out");
  x = w.activation(act, w.group_norm(*m.conv_norm_out, "conv_norm_out", x));
  x = w.conv(*m.conv_out, "conv_out", x);
  io.out("out_sample", x, dtype, {sample_dims[0], c.out_channels, sample_dims[2], sample_dims[3]});
  check_all_exported(m, g, "", "unet");
}

void write_controlnet(const ExportRequest& r, const io::ModelFolder& folder, OnnxGraph& g,
                      ExportResult& result) {
  const auto dtype = g.compute_dtype();
  const int64_t factor = vae_factor(folder);
  const auto [height, width] = image_size(r, folder, factor);
  const auto unet_config =
      models::UNet2DConditionConfig::from_json(folder.component_config("unet"));
  auto net = models::load_controlnet(folder.component_dir("controlnet"), torch::kCPU,
                                     torch::kFloat32, &unet_config);
  auto& m = *net;
  const auto& cc = m.controlnet_config();
  const auto& c = m.config();
  if (cc.condition_factor() != factor)
    throw InvalidArgument("ONNX export of the controlnet: its conditioning embedding scales by " +
                          std::to_string(cc.condition_factor()) + ", the VAE by " +
                          std::to_string(factor));
  Io io{g, result};
  ModuleWriter w(g);
  const Shapes s{r.dynamic};
  const auto in = unet_inputs(r, folder, c, height, width, factor, io, dtype);
  const auto cond = io.in("controlnet_cond", dtype,
                          {in.sample_dims[0], cc.conditioning_channels,
                           s.dim(height, "image_height"), s.dim(width, "image_width")});
  const auto shapes = skip_shapes(m, in.sample_dims, r.dynamic);
  const int64_t n = static_cast<int64_t>(shapes.size()) - 1;
  // One factor per residual, the mid one last: conditioning_scale everywhere, or guess mode's
  // logspace(-1, 0, n + 1) x conditioning_scale (models::guess_mode_scales): the caller's
  // choice, as in the pipeline.
  const auto scales = io.in("conditioning_scale", torch::kFloat32, {n + 1});

  const auto emb = unet_time_embedding(w, m, in, dtype);
  auto x = unet_conv_in(w, m, in.sample);
  g.set_scope("controlnet_cond_embedding");
  auto& e = *m.controlnet_cond_embedding;
  auto h = cond;
  if (cc.bgr) h = g.op("Gather", {h, g.ints({2, 1, 0}, "bgr")}, {{"axis", int64_t{1}}});
  h = w.silu(w.conv(*e.conv_in, "controlnet_cond_embedding.conv_in", h));
  for (size_t i = 0; i < e.block_list.size(); ++i)
    h = w.silu(
        w.conv(*e.block_list[i], "controlnet_cond_embedding.blocks." + std::to_string(i), h));
  h = w.conv(*e.conv_out, "controlnet_cond_embedding.conv_out", h);
  x = g.op("Add", {x, h});
  auto [skips, mid] = unet_down_path(w, m, x, emb, in.context);
  if (static_cast<int64_t>(skips.size()) != n)
    throw Error("ONNX export of the controlnet: " + std::to_string(skips.size()) +
                " skip connections, expected " + std::to_string(n));
  const auto residual = [&](nn::Conv2dImpl& zero_conv, const std::string& name, const Value& v,
                            int64_t index) {
    g.set_scope(name);
    auto out = w.conv(zero_conv, name, v);
    const auto factor_i = g.op("Gather", {scales, g.ints({index}, name + ".index")});
    out = g.op("Mul", {out, g.cast(factor_i, dtype)});
    if (cc.global_pool_conditions)
      out = g.op("ReduceMean", {out},
                 {{"axes", std::vector<int64_t>{2, 3}}, {"keepdims", int64_t{1}}});
    return out;
  };
  for (int64_t i = 0; i < n; ++i) {
    auto shape = shapes[static_cast<size_t>(i)];
    if (cc.global_pool_conditions) shape[2] = shape[3] = int64_t{1};
    io.out(
        "down_block_res_samples." + std::to_string(i),
        residual(*m.controlnet_down_list[static_cast<size_t>(i)],
                 "controlnet_down_blocks." + std::to_string(i), skips[static_cast<size_t>(i)], i),
        dtype, shape);
  }
  auto mid_shape = shapes.back();
  if (cc.global_pool_conditions) mid_shape[2] = mid_shape[3] = int64_t{1};
  io.out("mid_block_res_sample", residual(*m.controlnet_mid_block, "controlnet_mid_block", mid, n),
         dtype, mid_shape);
  check_all_exported(m, g, "", "controlnet");
}

void write_vae(const ExportRequest& r, const io::ModelFolder& folder, OnnxGraph& g,
               ExportResult& result, bool decoder) {
  const auto dtype = g.compute_dtype();
  const int64_t factor = vae_factor(folder);
  const auto [height, width] = image_size(r, folder, factor);
  auto vae = models::load_vae(folder, torch::kCPU, torch::kFloat32);
  auto& m = *vae;
  const auto& c = m.config();
  const Shapes s{r.dynamic};
  const auto B = s.dim(r.batch, "batch");
  Io io{g, result};
  ModuleWriter w(g);
  const std::vector<Dim> image_dims = {B, c.out_channels, s.dim(height, "height"),
                                       s.dim(width, "width")};
  const std::vector<Dim> latent_dims = {B, c.latent_channels,
                                        s.dim(height / factor, "latent_height"),
                                        s.dim(width / factor, "latent_width")};
  if (decoder) {
    auto z = io.in("latent_sample", dtype, latent_dims);
    auto& d = *m.decoder;
    if (m.post_quant_conv) {
      g.set_scope("post_quant_conv");
      z = w.conv(*m.post_quant_conv, "post_quant_conv", z);
    }
    g.set_scope("decoder.conv_in");
    auto h = w.conv(*d.conv_in, "decoder.conv_in", z);
    h = write_vae_mid_and_blocks(w, *d.mid_block, "decoder.mid_block", h);
    for (size_t i = 0; i < d.up_list.size(); ++i) {
      auto& block = *d.up_list[i];
      const auto name = "decoder.up_blocks." + std::to_string(i);
      for (size_t j = 0; j < block.resnet_list.size(); ++j)
        h = w.resnet(*block.resnet_list[j], name + ".resnets." + std::to_string(j), h);
      if (block.upsampler) h = w.upsample(*block.upsampler, name + ".upsamplers.0", h);
    }
    g.set_scope("decoder.conv_out");
    h = w.silu(w.group_norm(*d.conv_norm_out, "decoder.conv_norm_out", h));
    h = w.conv(*d.conv_out, "decoder.conv_out", h);
    io.out("sample", h, dtype, {B, c.out_channels, image_dims[2], image_dims[3]});
    check_all_exported(*m.decoder, g, "decoder.", "vae_decoder");
    if (m.post_quant_conv)
      check_all_exported(*m.post_quant_conv, g, "post_quant_conv.", "vae_decoder");
  } else {
    const std::vector<Dim> in_dims = {B, c.in_channels, image_dims[2], image_dims[3]};
    const auto x = io.in("sample", dtype, in_dims);
    auto& e = *m.encoder;
    g.set_scope("encoder.conv_in");
    auto h = w.conv(*e.conv_in, "encoder.conv_in", x);
    for (size_t i = 0; i < e.down_list.size(); ++i) {
      auto& block = *e.down_list[i];
      const auto name = "encoder.down_blocks." + std::to_string(i);
      for (size_t j = 0; j < block.resnet_list.size(); ++j)
        h = w.resnet(*block.resnet_list[j], name + ".resnets." + std::to_string(j), h);
      if (block.downsampler) h = w.downsample(*block.downsampler, name + ".downsamplers.0", h);
    }
    h = write_vae_mid_and_blocks(w, *e.mid_block, "encoder.mid_block", h);
    g.set_scope("encoder.conv_out");
    h = w.silu(w.group_norm(*e.conv_norm_out, "encoder.conv_norm_out", h));
    h = w.conv(*e.conv_out, "encoder.conv_out", h);
    if (m.quant_conv) {
      g.set_scope("quant_conv");
      h = w.conv(*m.quant_conv, "quant_conv", h);
    }
    io.out("latent_parameters", h, dtype,
           {B, 2 * c.latent_channels, latent_dims[2], latent_dims[3]});
    check_all_exported(*m.encoder, g, "encoder.", "vae_encoder");
    if (m.quant_conv) check_all_exported(*m.quant_conv, g, "quant_conv.", "vae_encoder");
  }
}

void write_text_encoder(const ExportRequest& r, const io::ModelFolder& folder, OnnxGraph& g,
                        ExportResult& result) {
  const auto dtype = g.compute_dtype();
  auto model = models::load_clip_text_model(folder, torch::kCPU, torch::kFloat32, r.component);
  auto& m = *model;
  const auto& c = m.config();
  const int64_t tokens = r.tokens > 0 ? r.tokens : c.max_position_embeddings;
  if (tokens > c.max_position_embeddings)
    throw InvalidArgument("--tokens " + std::to_string(tokens) + ": " + r.component + " has " +
                          std::to_string(c.max_position_embeddings) + " positions");
  const Shapes s{r.dynamic};
  const auto B = s.dim(r.batch, "batch");
  const auto S = s.dim(tokens, "sequence");
  Io io{g, result};
  ModuleWriter w(g);
  auto& tm = *m.text_model;
  const auto ids = io.in("input_ids", torch::kInt64, {B, S});

  g.set_scope("text_model.embeddings");
  const auto& emb = *tm.embeddings;
  const auto seq = g.dims_of(ids, {1});
  auto h = g.op(
      "Gather",
      {g.weight("text_model.embeddings.token_embedding.weight", emb.token_embedding->weight), ids},
      {{"axis", int64_t{0}}});
  const auto positions = g.op("Slice", {g.weight("text_model.embeddings.position_embedding.weight",
                                                 emb.position_embedding->weight),
                                        g.ints({0}, "start"), seq, g.ints({0}, "axes")});
  h = g.op("Add", {h, positions});
  // The causal mask: the lowest value of the compute dtype above the diagonal (transformers
  // fills with finfo.min), cut to the sequence at run time.
  const int64_t n = c.max_position_embeddings;
  const double lowest = dtype == torch::kFloat16 ? -65504.0 : std::numeric_limits<float>::lowest();
  const auto full_mask =
      g.tensor_const(torch::full({n, n}, lowest, torch::kFloat64).triu(1).to(dtype), "causal_mask");
  const auto mask = g.op("Slice", {full_mask, g.ints({0, 0}, "start"), g.concat_ints({seq, seq}),
                                   g.ints({0, 1}, "axes")});

  std::vector<Value> hidden{h};
  const int64_t heads = c.num_attention_heads, head_dim = c.hidden_size / heads;
  for (size_t i = 0; i < tm.encoder->layers->size(); ++i) {
    auto& layer = *tm.encoder->layers->ptr<models::ClipEncoderLayerImpl>(i);
    const auto name = "text_model.encoder.layers." + std::to_string(i);
    g.set_scope(name);
    auto& a = *layer.self_attn;
    const auto x = w.layer_norm(*layer.layer_norm1, name + ".layer_norm1", h);
    const auto q =
        w.split_heads(w.linear(*a.q_proj, name + ".self_attn.q_proj", x), heads, head_dim);
    const auto k =
        w.split_heads(w.linear(*a.k_proj, name + ".self_attn.k_proj", x), heads, head_dim);
    const auto v =
        w.split_heads(w.linear(*a.v_proj, name + ".self_attn.v_proj", x), heads, head_dim);
    const auto o = w.attention(q, k, v, std::pow(static_cast<double>(head_dim), -0.5), false, mask);
    h = g.op("Add", {h, w.linear(*a.out_proj, name + ".self_attn.out_proj",
                                 w.merge_heads(o, heads, head_dim))});
    auto& mlp = *layer.mlp;
    auto f = w.linear(*mlp.fc1, name + ".mlp.fc1",
                      w.layer_norm(*layer.layer_norm2, name + ".layer_norm2", h));
    f = mlp.act == "quick_gelu" ? w.quick_gelu(f) : w.gelu(f, mlp.act != "gelu");
    h = g.op("Add", {h, w.linear(*mlp.fc2, name + ".mlp.fc2", f)});
    hidden.push_back(h);
  }
  g.set_scope("text_model.final_layer_norm");
  const auto last = w.layer_norm(*tm.final_layer_norm, "text_model.final_layer_norm", h);
  const int64_t C = c.hidden_size;
  io.out("last_hidden_state", last, dtype, {B, S, C});

  // pooler_output: the state at the EOS token (transformers: the highest id for old configs
  // whose eos_token_id is 2, else the first eos_token_id).
  g.set_scope("pooler");
  Value marks = g.cast(ids, torch::kInt32);
  if (c.eos_token_id != 2)
    marks = g.cast(
        g.op("Equal",
             {ids, g.tensor_const(torch::scalar_tensor(c.eos_token_id, torch::kInt64), "eos")}),
        torch::kInt32);
  const auto eos = g.op("ArgMax", {marks}, {{"axis", int64_t{-1}}, {"keepdims", int64_t{0}}});
  const auto shape = g.op("Shape", {ids});
  const auto scalar_dim = [&](int64_t i) {
    return g.op("Gather", {shape, g.tensor_const(torch::scalar_tensor(i, torch::kInt64), "index")},
                {{"axis", int64_t{0}}});
  };
  const auto rows =
      g.op("Range", {g.tensor_const(torch::scalar_tensor(0, torch::kInt64), "zero"), scalar_dim(0),
                     g.tensor_const(torch::scalar_tensor(1, torch::kInt64), "one")});
  const auto flat_index = g.op("Add", {g.op("Mul", {rows, scalar_dim(1)}), eos});
  const auto flat = g.op("Reshape", {last, g.ints({-1, C}, "rows")});
  const auto pooled = g.op("Gather", {flat, flat_index}, {{"axis", int64_t{0}}});
  io.out("pooler_output", pooled, dtype, {B, C});
  if (m.text_projection) {
    g.set_scope("text_projection");
    io.out("text_embeds", w.linear(*m.text_projection, "text_projection", pooled), dtype,
           {B, c.projection_dim});
  }
  // Every layer's input and the last layer's output (transformers' output_hidden_states): SDXL
  // takes hidden_states[-2].
  for (size_t i = 0; i < hidden.size(); ++i)
    io.out("hidden_states." + std::to_string(i), hidden[i], dtype, {B, S, C});
  check_all_exported(m, g, "", r.component);
}

}  // namespace diffuse::onnx_export
