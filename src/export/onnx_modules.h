// The engine's modules written as ONNX ops (onnx_graph.h): each function reads the module's own
// options and parameters and emits what its forward() computes, in plain ONNX operators that
// offline compilers fuse (attention as MatMul/Softmax/MatMul, GroupNorm through
// InstanceNormalization, GELU through Erf). Weights are named by their state-dict keys
// (`name` is the module's dotted path in its component); linear weights are stored transposed,
// [in, out], as MatMul takes them (torch.onnx does the same).
#pragma once
#include <torch/nn/modules/normalization.h>

#include <string>

#include "export/onnx_graph.h"
#include "nn/activations.h"
#include "nn/fused_ops.h"
#include "nn/layers.h"
#include "nn/resnet.h"
#include "nn/transformer_2d.h"
#include "nn/vae_blocks.h"

namespace diffuse::nn {
struct TimestepsImpl;
struct TimestepEmbeddingImpl;
}  // namespace diffuse::nn

namespace diffuse::onnx_export {

class ModuleWriter {
 public:
  explicit ModuleWriter(OnnxGraph& graph) : g_(graph) {}
  OnnxGraph& graph() { return g_; }

  Value linear(nn::LinearImpl& layer, const std::string& name, const Value& x);
  // `pads` overrides the layer's symmetric padding ([top, left, bottom, right]).
  Value conv(nn::Conv2dImpl& layer, const std::string& name, const Value& x,
             const std::vector<int64_t>& pads = {});
  Value group_norm(torch::nn::GroupNormImpl& norm, const std::string& name, const Value& x);
  Value layer_norm(torch::nn::LayerNormImpl& norm, const std::string& name, const Value& x);
  // Over the last axis without affine parameters (FLUX's adaLN), and RMSNorm with its weight.
  Value plain_layer_norm(const Value& x, int64_t width, double eps);
  Value rms_norm(nn::RMSNormImpl& norm, const std::string& name, const Value& x);
  // weight * x / sqrt(mean(x^2) + eps) with the statistics in float32 (T5LayerNorm,
  // LlamaRMSNorm), the weight named `name`.weight.
  Value rms_norm_f32(const torch::Tensor& weight, double eps, const std::string& name,
                     const Value& x);
  // Rotary embedding of x [B, N, H, D] over its first 2R channels, pairs (2i, 2i+1) adjacent
  // (nn::apply_rope), with cos/sin [N, R] float32 (rope_angles).
  Value apply_rope(const Value& x, const Value& cos, const Value& sin, int64_t heads,
                   int64_t head_dim);
  // softmax(rope(q) rope(k)^T / sqrt(D)) v over q, k, v [B, N, H, D] -> [B, N, H*D] (the
  // joint attention of FLUX's and HiDream's blocks).
  Value rotary_attention(const Value& q, const Value& k, const Value& v, const Value& cos,
                         const Value& sin, int64_t heads, int64_t head_dim);
  // adaLN: `linear` on silu(cond) [B, width] -> `chunks` values [B, 1, width] (shift, scale,
  // gate, ...), and LayerNorm without affine (eps) * (1 + scale) + shift.
  std::vector<Value> adaln_chunks(nn::LinearImpl& linear, const std::string& name,
                                  const Value& cond, int64_t chunks, int64_t width);
  Value adaln_modulate(const Value& x, const Value& shift, const Value& scale, int64_t width,
                       double eps);
  // ids [N, axes] -> (cos, sin) [N, sum(axes_dims) / 2] as nn::rope_table (angles in float32
  // here, float64 rounded to float32 there).
  std::pair<Value, Value> rope_angles(const Value& ids, const std::vector<int64_t>& axes_dims,
                                      double theta);

  Value activation(nn::Activation act, const Value& x);
  Value silu(const Value& x);
  Value gelu(const Value& x, bool tanh_approximation = false);
  Value quick_gelu(const Value& x);

  // [B, N, H*D] <-> [B, H, N, D].
  Value split_heads(const Value& x, int64_t heads, int64_t head_dim);
  Value merge_heads(const Value& x, int64_t heads, int64_t head_dim);
  // softmax(q k^T * scale + mask) v over [B, H, N, D]; `upcast` runs scores and softmax in
  // float32 when the graph computes in float16 (diffusers' upcast_attention / upcast_softmax).
  Value attention(const Value& q, const Value& k, const Value& v, double scale, bool upcast,
                  const Value& mask = "");
  // [B, C, H, W] -> [B, H*W, C] and back (`like` gives B, H, W).
  Value to_tokens(const Value& x, int64_t channels);
  Value from_tokens(const Value& tokens, const Value& like, int64_t channels);

  Value resnet(nn::ResnetBlock2DImpl& block, const std::string& name, const Value& x,
               const Value& temb = "");
  Value downsample(nn::Downsample2DImpl& down, const std::string& name, const Value& x);
  // To the spatial size of `size_like` when given, else 2x.
  Value upsample(nn::Upsample2DImpl& up, const std::string& name, const Value& x,
                 const Value& size_like = "");
  Value cross_attention(nn::AttentionImpl& attn, const std::string& name, const Value& x,
                        const Value& context);
  Value feed_forward(nn::FeedForwardImpl& ff, const std::string& name, const Value& x);
  Value transformer_2d(nn::Transformer2DModelImpl& t, const std::string& name, const Value& x,
                       const Value& context);
  Value spatial_attention(nn::SpatialSelfAttentionImpl& attn, const std::string& name,
                          const Value& x);
  // t [N] (float32) -> [N, channels] float32, as nn::get_timestep_embedding.
  Value timesteps(const nn::TimestepsImpl& proj, const Value& t);
  Value timestep_embedding(nn::TimestepEmbeddingImpl& emb, const std::string& name, const Value& x);

 private:
  OnnxGraph& g_;
};

}  // namespace diffuse::onnx_export
