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

}  // namespace

void write_unet(const ExportRequest& r, const io::ModelFolder& folder, OnnxGraph& g,
                ExportResult& result) {
  const auto dtype = g.compute_dtype();
  const int64_t factor = vae_factor(folder);
  const auto [height, width] = image_size(r, folder, factor);
  auto unet = models::load_unet(folder, torch::kCPU, torch::kFloat32);
  auto& m = *unet;
  const auto& c = m.config();
  const int64_t tokens = r.tokens > 0 ? r.tokens : 77;
  const Shapes s{r.dynamic};
  const auto B = s.dim(r.batch, "batch");
  Io io{g, result};
  ModuleWriter w(g);

  const std::vector<Dim> sample_dims = {B, c.in_channels, s.dim(height / factor, "height"),
                                        s.dim(width / factor, "width")};
  auto x = io.in("sample", dtype, sample_dims);
  const auto timestep = io.in("timestep", torch::kFloat32, {B});
  const auto context = io.in("encoder_hidden_states", dtype,
                             {B, s.dim(tokens, "sequence"), c.cross_attention_dim[0]});
  Value text_embeds, time_ids;
  int64_t time_id_count = 0;
  if (c.text_time) {
    int64_t pooled = 0;
    std::tie(pooled, time_id_count) = sdxl_added_sizes(folder, c);
    text_embeds = io.in("text_embeds", dtype, {B, pooled});
    time_ids = io.in("time_ids", dtype, {B, time_id_count});
  }

  const auto act = nn::parse_activation(c.act_fn, c.source);
  g.set_scope("time_embedding");
  auto emb = w.timestep_embedding(*m.time_embedding, "time_embedding",
                                  g.cast(w.timesteps(*m.time_proj, timestep), dtype));
  if (c.text_time) {
    g.set_scope("add_embedding");
    const auto flat = g.op("Reshape", {g.cast(time_ids, torch::kFloat32), g.ints({-1}, "flat")});
    const auto time_embeds =
        g.op("Reshape", {w.timesteps(*m.add_time_proj, flat),
                         g.ints({-1, time_id_count * c.addition_time_embed_dim}, "rows")});
    const auto add = g.op("Concat", {g.cast(text_embeds, torch::kFloat32), time_embeds},
                          {{"axis", int64_t{-1}}});
    emb = g.op("Add",
               {emb, w.timestep_embedding(*m.add_embedding, "add_embedding", g.cast(add, dtype))});
  }
  if (c.time_embedding_act_fn)
    emb = w.activation(nn::parse_activation(*c.time_embedding_act_fn, c.source), emb);

  g.set_scope("conv_in");
  if (c.center_input_sample)
    x = g.op("Sub", {g.op("Mul", {x, g.scalar(2.0, "two")}), g.scalar(1.0, "one")});
  x = w.conv(*m.conv_in, "conv_in", x);
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
