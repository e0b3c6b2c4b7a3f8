#include "export/onnx_modules.h"

#include <torch/torch.h>

#include <cmath>
#include <variant>

#include "diffuse/errors.h"
#include "nn/embeddings.h"
#include "nn/timestep_frequencies.h"

namespace diffuse::onnx_export {
namespace {

// The convolution's explicit padding: LibTorch 1.x keeps it in a c10::variant, 2.x in a
// std::variant; an unqualified get_if finds either (ADL), `using` makes it parse as a template.
std::vector<int64_t> explicit_padding(const torch::nn::detail::ConvNdOptions<2>& options,
                                      const std::string& name) {
  using std::get_if;
  const auto& padding = options.padding();
  const auto* sizes = get_if<torch::ExpandingArray<2>>(&padding);
  if (!sizes)
    throw InvalidArgument("ONNX export: " + name +
                          " uses 'same'/'valid' padding; only explicit padding is exported");
  const auto& p = **sizes;
  return {p[0], p[1], p[0], p[1]};
}

Attrs axis(int64_t a) {
  return {{"axis", a}};
}

}  // namespace

Value ModuleWriter::linear(nn::LinearImpl& layer, const std::string& name, const Value& x) {
  if (layer.quantized)
    throw InvalidArgument("ONNX export: " + name +
                          " holds quantized blocks; export from the plain weights");
  if (!layer.low_rank.empty())
    throw InvalidArgument("ONNX export: " + name +
                          " carries unmerged LoRA updates; merge them before exporting");
  const auto w = g_.weight(name + ".weight", layer.weight.detach().t());
  auto y = g_.op("MatMul", {x, w});
  if (layer.bias.defined()) y = g_.op("Add", {y, g_.weight(name + ".bias", layer.bias)});
  return y;
}

Value ModuleWriter::conv(nn::Conv2dImpl& layer, const std::string& name, const Value& x,
                         const std::vector<int64_t>& pads) {
  if (!layer.low_rank.empty())
    throw InvalidArgument("ONNX export: " + name +
                          " carries unmerged LoRA updates; merge them before exporting");
  layer.drop_packed();  // the plain weight, should packing have replaced it
  const auto& o = layer.options;
  const auto& k = o.kernel_size();
  const auto& s = o.stride();
  const auto& d = o.dilation();
  std::vector<Value> inputs = {x, g_.weight(name + ".weight", layer.weight)};
  if (layer.bias.defined()) inputs.push_back(g_.weight(name + ".bias", layer.bias));
  return g_.op("Conv", inputs,
               {{"kernel_shape", std::vector<int64_t>{k->at(0), k->at(1)}},
                {"strides", std::vector<int64_t>{s->at(0), s->at(1)}},
                {"dilations", std::vector<int64_t>{d->at(0), d->at(1)}},
                {"group", o.groups()},
                {"pads", pads.empty() ? explicit_padding(o, name) : pads}});
}

Value ModuleWriter::group_norm(torch::nn::GroupNormImpl& norm, const std::string& name,
                               const Value& x) {
  const int64_t groups = norm.options.num_groups();
  // GroupNormalization is opset 18 (and ATC knows InstanceNormalization): normalise the
  // [B, G, C/G * H * W] view per group, then the per-channel affine.
  const auto grouped = g_.op("Reshape", {x, g_.ints({0, groups, -1}, "groups")});
  const auto ones = g_.tensor_const(torch::ones({groups}, g_.compute_dtype()), "ones");
  const auto zeros = g_.tensor_const(torch::zeros({groups}, g_.compute_dtype()), "zeros");
  auto y =
      g_.op("InstanceNormalization", {grouped, ones, zeros}, {{"epsilon", norm.options.eps()}});
  y = g_.op("Reshape", {y, g_.op("Shape", {x})});
  if (!norm.options.affine()) return y;
  const auto per_channel = g_.ints({1, 2}, "axes");
  y = g_.op("Mul",
            {y, g_.op("Unsqueeze", {g_.weight(name + ".weight", norm.weight), per_channel})});
  return g_.op("Add", {y, g_.op("Unsqueeze", {g_.weight(name + ".bias", norm.bias), per_channel})});
}

Value ModuleWriter::layer_norm(torch::nn::LayerNormImpl& norm, const std::string& name,
                               const Value& x) {
  if (norm.options.normalized_shape().size() != 1)
    throw InvalidArgument("ONNX export: " + name + " normalises over more than the last axis");
  const double eps = norm.options.eps();
  if (!norm.options.elementwise_affine())
    return plain_layer_norm(x, norm.options.normalized_shape()[0], eps);
  const auto weight = g_.weight(name + ".weight", norm.weight);
  const auto bias = g_.weight(name + ".bias", norm.bias);
  if (g_.opset() >= 17)
    return g_.op("LayerNormalization", {x, weight, bias},
                 {{"axis", int64_t{-1}}, {"epsilon", eps}});
  return g_.op("Add", {g_.op("Mul", {plain_layer_norm(x, 0, eps), weight}), bias});
}

Value ModuleWriter::plain_layer_norm(const Value& x, int64_t width, double eps) {
  if (g_.opset() >= 17 && width > 0)
    return g_.op("LayerNormalization",
                 {x, g_.tensor_const(torch::ones({width}, g_.compute_dtype()), "ones")},
                 {{"axis", int64_t{-1}}, {"epsilon", eps}});
  // Below opset 17: the same arithmetic in primitive ops.
  const Attrs last = {{"axes", std::vector<int64_t>{-1}}, {"keepdims", int64_t{1}}};
  const auto centred = g_.op("Sub", {x, g_.op("ReduceMean", {x}, last)});
  const auto var = g_.op("ReduceMean", {g_.op("Mul", {centred, centred})}, last);
  return g_.op("Div", {centred, g_.op("Sqrt", {g_.op("Add", {var, g_.scalar(eps, "eps")})})});
}

Value ModuleWriter::rms_norm(nn::RMSNormImpl& norm, const std::string& name, const Value& x) {
  const Attrs last = {{"axes", std::vector<int64_t>{-1}}, {"keepdims", int64_t{1}}};
  const auto mean_square = g_.op("ReduceMean", {g_.op("Mul", {x, x})}, last);
  const auto rms = g_.op("Sqrt", {g_.op("Add", {mean_square, g_.scalar(norm.eps, "eps")})});
  return g_.op("Mul", {g_.op("Div", {x, rms}), g_.weight(name + ".weight", norm.weight)});
}

Value ModuleWriter::rms_norm_f32(const torch::Tensor& weight, double eps, const std::string& name,
                                 const Value& x) {
  const Attrs last = {{"axes", std::vector<int64_t>{-1}}, {"keepdims", int64_t{1}}};
  const auto h = g_.cast(x, torch::kFloat32);
  const auto mean_square = g_.op("ReduceMean", {g_.op("Mul", {h, h})}, last);
  const auto rms = g_.op("Sqrt", {g_.op("Add", {mean_square, g_.scalar_f32(eps, "eps")})});
  const auto normed = g_.cast(g_.op("Div", {h, rms}), g_.compute_dtype());
  return g_.op("Mul", {g_.weight(name + ".weight", weight), normed});
}

std::pair<Value, Value> ModuleWriter::rope_angles(const Value& ids,
                                                  const std::vector<int64_t>& axes_dims,
                                                  double theta) {
  // One row of frequencies per axis, placed in its slice of the rotated channels: angle =
  // ids @ F with F [axes, R] (zeros outside each axis's slice), one MatMul for every axis.
  int64_t rotated = 0;
  for (auto d : axes_dims) rotated += d / 2;
  auto freqs = torch::zeros({static_cast<int64_t>(axes_dims.size()), rotated}, torch::kFloat64);
  int64_t col = 0;
  for (size_t a = 0; a < axes_dims.size(); ++a) {
    const int64_t d = axes_dims[a];
    const auto omega =
        1.0 / torch::pow(theta, torch::arange(0, d, 2, torch::kFloat64) / static_cast<double>(d));
    freqs[static_cast<int64_t>(a)].narrow(0, col, d / 2).copy_(omega);
    col += d / 2;
  }
  const auto angle = g_.op("MatMul", {g_.cast(ids, torch::kFloat32),
                                      g_.tensor_const(freqs.to(torch::kFloat32), "rope_freqs")});
  return {g_.op("Cos", {angle}), g_.op("Sin", {angle})};
}

Value ModuleWriter::rotary_attention(const Value& q, const Value& k, const Value& v,
                                     const Value& cos, const Value& sin, int64_t heads,
                                     int64_t head_dim) {
  const Attrs perm = {{"perm", std::vector<int64_t>{0, 2, 1, 3}}};
  const auto rq = g_.op("Transpose", {apply_rope(q, cos, sin, heads, head_dim)}, perm);
  const auto rk = g_.op("Transpose", {apply_rope(k, cos, sin, heads, head_dim)}, perm);
  const auto o = attention(rq, rk, g_.op("Transpose", {v}, perm),
                           std::pow(static_cast<double>(head_dim), -0.5), false);
  return merge_heads(o, heads, head_dim);
}

std::vector<Value> ModuleWriter::adaln_chunks(nn::LinearImpl& layer, const std::string& name,
                                              const Value& cond, int64_t chunks, int64_t width) {
  const auto y = g_.op("Unsqueeze", {linear(layer, name, silu(cond)), g_.ints({1}, "axes")});
  return g_.op_n("Split", {y, g_.ints(std::vector<int64_t>(chunks, width), "split")},
                 static_cast<int>(chunks), {{"axis", int64_t{-1}}});
}

Value ModuleWriter::adaln_modulate(const Value& x, const Value& shift, const Value& scale,
                                   int64_t width, double eps) {
  const auto n = plain_layer_norm(x, width, eps);
  return g_.op("Add", {g_.op("Mul", {n, g_.op("Add", {scale, g_.scalar(1.0, "one")})}), shift});
}

Value ModuleWriter::apply_rope(const Value& x, const Value& cos, const Value& sin, int64_t heads,
                               int64_t head_dim) {
  // [B, N, H, D] -> [B, N, H, D/2, 2]; the table [N, R] broadcasts as [N, 1, R, 1].
  const int64_t pairs = head_dim / 2;
  const auto x2 = g_.op("Reshape", {x, g_.ints({0, 0, heads, pairs, 2}, "pairs")});
  const auto parts = g_.op_n("Split", {x2, g_.ints({1, 1}, "split")}, 2, {{"axis", int64_t{-1}}});
  const auto axes = g_.ints({1, 3}, "axes");
  const auto c = g_.cast(g_.op("Unsqueeze", {cos, axes}), g_.compute_dtype());
  const auto s = g_.cast(g_.op("Unsqueeze", {sin, axes}), g_.compute_dtype());
  const auto out0 = g_.op("Sub", {g_.op("Mul", {c, parts[0]}), g_.op("Mul", {s, parts[1]})});
  const auto out1 = g_.op("Add", {g_.op("Mul", {s, parts[0]}), g_.op("Mul", {c, parts[1]})});
  const auto rotated = g_.op("Concat", {out0, out1}, {{"axis", int64_t{-1}}});
  return g_.op("Reshape", {rotated, g_.ints({0, 0, heads, head_dim}, "heads")});
}

Value ModuleWriter::silu(const Value& x) {
  return g_.op("Mul", {x, g_.op("Sigmoid", {x})});
}

Value ModuleWriter::gelu(const Value& x, bool tanh_approximation) {
  // Gelu itself is opset 20.
  const auto half_x = g_.op("Mul", {x, g_.scalar(0.5, "half")});
  Value inner;
  if (tanh_approximation) {
    const auto cube = g_.op("Mul", {g_.op("Mul", {x, x}), x});
    const auto arg = g_.op("Add", {x, g_.op("Mul", {cube, g_.scalar(0.044715, "c")})});
    inner = g_.op("Tanh", {g_.op("Mul", {arg, g_.scalar(std::sqrt(2.0 / M_PI), "sqrt_2_pi")})});
  } else {
    inner = g_.op("Erf", {g_.op("Div", {x, g_.scalar(std::sqrt(2.0), "sqrt2")})});
  }
  return g_.op("Mul", {half_x, g_.op("Add", {inner, g_.scalar(1.0, "one")})});
}

Value ModuleWriter::quick_gelu(const Value& x) {
  return g_.op("Mul", {x, g_.op("Sigmoid", {g_.op("Mul", {x, g_.scalar(1.702, "c")})})});
}

Value ModuleWriter::activation(nn::Activation act, const Value& x) {
  switch (act) {
    case nn::Activation::kSilu:
      return silu(x);
    case nn::Activation::kGelu:
      return gelu(x);
    case nn::Activation::kRelu:
      return g_.op("Relu", {x});
    case nn::Activation::kMish:
      return g_.op("Mul", {x, g_.op("Tanh", {g_.op("Softplus", {x})})});
  }
  throw Error("ONNX export: unknown activation");
}

Value ModuleWriter::split_heads(const Value& x, int64_t heads, int64_t head_dim) {
  const auto h = g_.op("Reshape", {x, g_.ints({0, 0, heads, head_dim}, "heads")});
  return g_.op("Transpose", {h}, {{"perm", std::vector<int64_t>{0, 2, 1, 3}}});
}

Value ModuleWriter::merge_heads(const Value& x, int64_t heads, int64_t head_dim) {
  const auto t = g_.op("Transpose", {x}, {{"perm", std::vector<int64_t>{0, 2, 1, 3}}});
  return g_.op("Reshape", {t, g_.ints({0, 0, heads * head_dim}, "tokens")});
}

Value ModuleWriter::attention(const Value& q_in, const Value& k_in, const Value& v, double scale,
                              bool upcast, const Value& mask) {
  const bool up = upcast && g_.compute_dtype() != torch::kFloat32;
  const auto q = up ? g_.cast(q_in, torch::kFloat32) : q_in;
  const auto k = up ? g_.cast(k_in, torch::kFloat32) : k_in;
  const auto kt = g_.op("Transpose", {k}, {{"perm", std::vector<int64_t>{0, 1, 3, 2}}});
  auto scores = g_.op("MatMul", {q, kt});
  scores = g_.op("Mul", {scores, up ? g_.scalar_f32(scale, "scale") : g_.scalar(scale, "scale")});
  if (!mask.empty()) scores = g_.op("Add", {scores, mask});
  auto probs = g_.op("Softmax", {scores}, axis(-1));
  if (up) probs = g_.cast(probs, g_.compute_dtype());
  return g_.op("MatMul", {probs, v});
}

Value ModuleWriter::to_tokens(const Value& x, int64_t channels) {
  const auto t = g_.op("Transpose", {x}, {{"perm", std::vector<int64_t>{0, 2, 3, 1}}});
  return g_.op("Reshape", {t, g_.ints({0, -1, channels}, "tokens")});
}

Value ModuleWriter::from_tokens(const Value& tokens, const Value& like, int64_t channels) {
  const auto shape = g_.concat_ints({g_.dims_of(like, {0, 2, 3}), g_.ints({channels}, "c")});
  const auto nhwc = g_.op("Reshape", {tokens, shape});
  return g_.op("Transpose", {nhwc}, {{"perm", std::vector<int64_t>{0, 3, 1, 2}}});
}

Value ModuleWriter::resnet(nn::ResnetBlock2DImpl& block, const std::string& name, const Value& x,
                           const Value& temb) {
  const auto& o = block.options;
  g_.set_scope(name);
  auto h = conv(*block.conv1, name + ".conv1",
                activation(o.act, group_norm(*block.norm1, name + ".norm1", x)));
  if (block.time_emb_proj && !temb.empty()) {
    auto t = linear(*block.time_emb_proj, name + ".time_emb_proj", activation(o.act, temb));
    t = g_.op("Unsqueeze", {t, g_.ints({2, 3}, "axes")});
    if (o.time_embedding_norm == nn::TimeEmbeddingNorm::kScaleShift) {
      const int64_t c = o.out_channels;
      const auto parts = g_.op_n("Split", {t, g_.ints({c, c}, "split")}, 2, axis(1));
      h = group_norm(*block.norm2, name + ".norm2", h);
      h = g_.op("Add",
                {g_.op("Mul", {h, g_.op("Add", {parts[0], g_.scalar(1.0, "one")})}), parts[1]});
      h = activation(o.act, h);
    } else {
      h = activation(o.act, group_norm(*block.norm2, name + ".norm2", g_.op("Add", {h, t})));
    }
  } else {
    h = activation(o.act, group_norm(*block.norm2, name + ".norm2", h));
  }
  h = conv(*block.conv2, name + ".conv2", h);
  const auto residual =
      block.conv_shortcut ? conv(*block.conv_shortcut, name + ".conv_shortcut", x) : x;
  auto out = g_.op("Add", {residual, h});
  if (o.output_scale_factor != 1.0)
    out = g_.op("Div", {out, g_.scalar(o.output_scale_factor, "scale")});
  return out;
}

Value ModuleWriter::downsample(nn::Downsample2DImpl& down, const std::string& name,
                               const Value& x) {
  g_.set_scope(name);
  if (!down.use_conv)
    return g_.op(
        "AveragePool", {x},
        {{"kernel_shape", std::vector<int64_t>{2, 2}}, {"strides", std::vector<int64_t>{2, 2}}});
  // padding 0: diffusers pads (0, 1, 0, 1) first, which Conv's own pads express.
  if (down.padding == 0) return conv(*down.conv, name + ".conv", x, {0, 0, 1, 1});
  return conv(*down.conv, name + ".conv", x);
}

Value ModuleWriter::upsample(nn::Upsample2DImpl& up, const std::string& name, const Value& x,
                             const Value& size_like) {
  g_.set_scope(name);
  const auto hw = size_like.empty() ? g_.op("Mul", {g_.dims_of(x, {2, 3}), g_.ints({2, 2}, "two")})
                                    : g_.dims_of(size_like, {2, 3});
  const auto sizes = g_.concat_ints({g_.dims_of(x, {0, 1}), hw});
  // torch's nearest: source index floor(dst * in / out), which is ONNX's asymmetric + floor.
  auto h = g_.op("Resize", {x, "", "", sizes},
                 {{"mode", std::string("nearest")},
                  {"coordinate_transformation_mode", std::string("asymmetric")},
                  {"nearest_mode", std::string("floor")}});
  return up.conv ? conv(*up.conv, name + ".conv", h) : h;
}

Value ModuleWriter::cross_attention(nn::AttentionImpl& attn, const std::string& name,
                                    const Value& x, const Value& context) {
  const auto& ctx = context.empty() ? x : context;
  const auto q = split_heads(linear(*attn.to_q, name + ".to_q", x), attn.heads, attn.dim_head);
  const auto k = split_heads(linear(*attn.to_k, name + ".to_k", ctx), attn.heads, attn.dim_head);
  const auto v = split_heads(linear(*attn.to_v, name + ".to_v", ctx), attn.heads, attn.dim_head);
  const auto o =
      attention(q, k, v, std::pow(static_cast<double>(attn.dim_head), -0.5), attn.upcast_attention);
  return linear(*attn.out_proj, name + ".to_out.0", merge_heads(o, attn.heads, attn.dim_head));
}

Value ModuleWriter::feed_forward(nn::FeedForwardImpl& ff, const std::string& name, const Value& x) {
  const auto proj = linear(*ff.act->proj, name + ".net.0.proj", x);
  const int64_t inner = ff.act->proj->weight.size(0) / 2;
  const auto parts = g_.op_n("Split", {proj, g_.ints({inner, inner}, "split")}, 2, axis(-1));
  return linear(*ff.out, name + ".net.2", g_.op("Mul", {parts[0], gelu(parts[1])}));
}

Value ModuleWriter::transformer_2d(nn::Transformer2DModelImpl& t, const std::string& name,
                                   const Value& x, const Value& context) {
  g_.set_scope(name);
  const int64_t channels = t.options.in_channels, inner = t.inner_dim;
  auto h = group_norm(*t.norm, name + ".norm", x);
  if (t.proj_in_linear) {
    h = linear(*t.proj_in_linear, name + ".proj_in", to_tokens(h, channels));
  } else {
    h = to_tokens(conv(*t.proj_in_conv, name + ".proj_in", h), inner);
  }
  for (size_t i = 0; i < t.blocks.size(); ++i) {
    auto& b = *t.blocks[i];
    const auto bn = name + ".transformer_blocks." + std::to_string(i);
    g_.set_scope(bn);
    const auto attn1_ctx = b.options.only_cross_attention ? context : Value();
    h = g_.op("Add", {cross_attention(*b.attn1, bn + ".attn1",
                                      layer_norm(*b.norm1, bn + ".norm1", h), attn1_ctx),
                      h});
    h = g_.op("Add", {cross_attention(*b.attn2, bn + ".attn2",
                                      layer_norm(*b.norm2, bn + ".norm2", h), context),
                      h});
    h = g_.op("Add", {feed_forward(*b.ff, bn + ".ff", layer_norm(*b.norm3, bn + ".norm3", h)), h});
  }
  g_.set_scope(name);
  if (t.proj_out_linear) {
    h = from_tokens(linear(*t.proj_out_linear, name + ".proj_out", h), x, channels);
  } else {
    h = conv(*t.proj_out_conv, name + ".proj_out", from_tokens(h, x, inner));
  }
  return g_.op("Add", {x, h});
}

Value ModuleWriter::spatial_attention(nn::SpatialSelfAttentionImpl& attn, const std::string& name,
                                      const Value& x) {
  g_.set_scope(name);
  const int64_t channels = attn.channels, heads = attn.heads, head_dim = channels / heads;
  const auto tokens = to_tokens(group_norm(*attn.group_norm, name + ".group_norm", x), channels);
  const auto q = split_heads(linear(*attn.to_q, name + ".to_q", tokens), heads, head_dim);
  const auto k = split_heads(linear(*attn.to_k, name + ".to_k", tokens), heads, head_dim);
  const auto v = split_heads(linear(*attn.to_v, name + ".to_v", tokens), heads, head_dim);
  // diffusers builds the VAE's attention with upcast_softmax.
  const auto o = attention(q, k, v, std::pow(static_cast<double>(head_dim), -0.5), true);
  const auto h = linear(*attn.out_proj, name + ".to_out.0", merge_heads(o, heads, head_dim));
  auto out = g_.op("Add", {x, from_tokens(h, x, channels)});
  if (attn.rescale_output_factor != 1.0)
    out = g_.op("Div", {out, g_.scalar(attn.rescale_output_factor, "scale")});
  return out;
}

Value ModuleWriter::timesteps(const nn::TimestepsImpl& proj, const Value& t) {
  const int64_t half = proj.num_channels / 2;
  // The engine's own frequencies (computed once in float32 on the CPU), as a constant.
  const auto freqs = g_.tensor_const(
      nn::timestep_frequencies(half, proj.downscale_freq_shift, 10000.0, torch::kCPU).unsqueeze(0),
      "timestep_frequencies");
  const auto args = g_.op("Mul", {g_.op("Unsqueeze", {t, g_.ints({1}, "axes")}), freqs});
  const auto sin = g_.op("Sin", {args}), cos = g_.op("Cos", {args});
  auto emb = g_.op(
      "Concat", proj.flip_sin_to_cos ? std::vector<Value>{cos, sin} : std::vector<Value>{sin, cos},
      axis(-1));
  if (proj.num_channels % 2 == 1) emb = g_.op("Pad", {emb, g_.ints({0, 0, 0, 1}, "pads")});
  return emb;
}

Value ModuleWriter::timestep_embedding(nn::TimestepEmbeddingImpl& emb, const std::string& name,
                                       const Value& x) {
  g_.set_scope(name);
  auto h = linear(*emb.linear_2, name + ".linear_2",
                  activation(emb.act, linear(*emb.linear_1, name + ".linear_1", x)));
  if (emb.post_act) h = activation(*emb.post_act, h);
  return h;
}

}  // namespace diffuse::onnx_export
