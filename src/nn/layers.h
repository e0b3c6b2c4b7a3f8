// Linear, Conv2d and Embedding layers for the models, built through these factories so that a
// model about to receive its weights can skip LibTorch's random initialisation: under a
// SkipInitGuard they allocate their weights uninitialised, directly in the guard's dtype
// (SD2's UNet: 865M parameters, ~4 s of kaiming_uniform_ on one core, and no float32 copy of
// a bf16 model). Without a guard they are ordinary, initialised LibTorch layers.
//
// nn::Linear and nn::Conv2d are LibTorch's layers (same parameters, same names) that can also
// add low-rank updates to their output at run time: unmerged LoRA (adapters/lora_runtime.h).
// Without updates they compute exactly what LibTorch's layers compute.
#pragma once
#include <c10/core/ScalarType.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>

#include <memory>
#include <set>
#include <string>
#include <vector>

#include "quant/quantized_weight.h"

namespace diffuse::nn {

// One run-time low-rank update: y += scale * up(down(x)). Linear: down [r, in], up [out, r].
// Conv2d: down [r, in, kh, kw] (a convolution with the layer's stride, padding and dilation),
// up [out, r, 1, 1].
struct LowRankUpdate {
  torch::Tensor down, up;
  double scale = 1;
};

class LinearImpl : public torch::nn::LinearImpl {
 public:
  using torch::nn::LinearImpl::LinearImpl;
  torch::Tensor forward(const torch::Tensor& input);
  // forward(input) + residual. For bf16 on the CPU the bias and the residual join the product
  // in one pass (nn::add_bias_residual_), else it is exactly forward(input) + residual.
  torch::Tensor forward_add(const torch::Tensor& input, const torch::Tensor& residual);
  // input @ weight^T plus the low-rank updates, without the bias: for a caller that adds the
  // bias in a pass of its own (nn::geglu).
  torch::Tensor product(const torch::Tensor& input);
  std::vector<LowRankUpdate> low_rank;  // empty: a plain linear layer
  // The weight kept in ggml blocks (keep_quantized): `weight` then holds a placeholder of its
  // shape, dtype and device over 2 bytes, and every call dequantizes the blocks into the
  // input's dtype. Null: the plain weight.
  std::shared_ptr<const quant::QuantizedWeight> quantized;
  // Replaces the plain weight by `q` (of the weight's shape); the placeholder goes to the blocks'
  // device, so that loading onto an accelerator never moves the plain weight there.
  void keep_quantized(quant::QuantizedWeight q);
  // The weight as this call uses it: dequantized (on the CPU into a buffer the thread reuses:
  // valid until the thread dequantizes another), or widened to the input's dtype.
  torch::Tensor weight_for(const torch::Tensor& input) const;

 private:
  void add_low_rank(torch::Tensor& y, const torch::Tensor& input) const;
};
TORCH_MODULE(Linear);

// Keeps the weight of every nn::Linear in `module` whose rows are whole blocks of `type` in
// ggml blocks (see LinearImpl::quantized): about 53 % of bf16's bytes at q8_0, 28 % at q4_0.
// Layers with other widths stay plain. Call it once the module has its final device and dtype
// (moving it afterwards would materialise the placeholders). Adapters must run unmerged
// (LowRankUpdate), since there is no plain weight to merge into.
struct QuantizedLayers {
  int layers = 0, kept_plain = 0;
  int64_t plain_bytes = 0, quantized_bytes = 0;  // of the layers that were quantized
};
QuantizedLayers quantize_linear_layers(torch::nn::Module& module, quant::GgmlType type);
// The same for every nn::Conv2d whose weight rows (in / groups * kh * kw values: 2880 for a
// 3x3 over 320 channels) are whole blocks of `type`; the others (a UNet's conv_in over 4
// latent channels) stay plain.
QuantizedLayers quantize_conv_layers(torch::nn::Module& module, quant::GgmlType type);
// Bytes held by the quantized blocks of `module`'s linear and convolution layers.
int64_t quantized_weight_bytes(const torch::nn::Module& module);
// Bytes `module`'s parameters hold in memory: each as stored (16-bit weights 2 bytes an
// element), a quantized layer's blocks instead of its weight's placeholder (one element
// broadcast to the weight's shape).
int64_t resident_parameter_bytes(const torch::nn::Module& module);

class Conv2dImpl : public torch::nn::Conv2dImpl {
 public:
  using torch::nn::Conv2dImpl::Conv2dImpl;
  torch::Tensor forward(const torch::Tensor& input);
  std::vector<LowRankUpdate> low_rank;  // empty: a plain convolution
  // Keep a copy of the weight in oneDNN's blocked layout for bf16 CPU inputs that run NCHW
  // (below 32x32 pixels, see to_compute_layout), instead of oneDNN reordering the plain
  // weight at every call: there the reorder is 15-35 % of the convolution (SD's 8x8 and 16x16
  // levels, 1280-2560 channels), for one more copy of those weights in memory. The copy
  // follows the weight: rebuilt when the weight is replaced or written in place (its version
  // counter; see drop_packed_weights for inference tensors and writes through .data()). A
  // replaced weight's old storage lives until the next forward or drop_packed_weights. Off by
  // default; set_weight_packing turns it on for a network.
  // The packed copy replaces the plain one (one copy of the weights, not two): the weight keeps
  // its shape over a 2-byte placeholder and comes back from the packed copy (oneDNN's to_dense,
  // exact) when a call cannot take the packed path (another resolution, gradients) or
  // drop_packed() runs, which every reader and writer outside forward calls first
  // (drop_packed_weights); an in-place write to the placeholder fails loudly.
  bool pack_weight = false;
  // Drops the packed copy, giving the weight its plain values back first if they were given up.
  void drop_packed();
  int64_t packed_bytes() const;  // of the packed copy; 0 when there is none
  // Whether the weight's plain storage was given up for the packed copy.
  bool plain_weight_released() const { return released_; }
  // The weight kept in ggml blocks as an [out, in / groups * kh * kw] matrix (keep_quantized),
  // as LinearImpl::quantized: every call dequantizes it into the input's dtype (into the
  // thread's reused buffer on the CPU) and convolves with that; never packed. Null: the plain
  // weight.
  std::shared_ptr<const quant::QuantizedWeight> quantized;
  // Replaces the plain weight by `q`; drops a packed copy first.
  void keep_quantized(quant::QuantizedWeight q);

 private:
  torch::Tensor convolve(const torch::Tensor& input, const torch::Tensor& weight);
  void add_low_rank(torch::Tensor& y, const torch::Tensor& input) const;
  torch::Tensor packed_weight(const torch::Tensor& input);
  void drop_packed_locked();  // drop_packed with the packing lock held
  torch::Tensor packed_;
  bool released_ = false;
  // What packed_ was made from: the weight's storage, held so that its address cannot come
  // back as a new weight's, its first element's address and its version.
  c10::Storage packed_storage_;
  const void* packed_from_ = nullptr;
  int64_t packed_version_ = -1;
};
TORCH_MODULE(Conv2d);

// The names of the weights of every nn::Linear and nn::Conv2d in `module` ("a.b.weight"): the
// parameters that may stay in a 16-bit file dtype under float32 compute (load_state_dict's
// keep_16bit). Such a weight is widened to the input's dtype for each call.
std::set<std::string> layer_weight_names(const torch::nn::Module& module);

// The parameter whose device and dtype a network's inputs follow when this layer is its first:
// the bias, which is never kept in 16 bits (a weight may be, see layer_weight_names), else the
// weight.
inline const torch::Tensor& compute_reference(const Conv2dImpl& layer) {
  return layer.bias.defined() ? layer.bias : layer.weight;
}

// Sets Conv2dImpl::pack_weight on every nn::Conv2d in `module`; turning it off frees the
// packed copies.
void set_weight_packing(torch::nn::Module& module, bool enabled);

// Frees the packed copies of `module`'s convolutions and gives their weights the plain values
// back; the copies are made again at their next forward. Call it before reading or writing the
// weights outside forward (saving, merging LoRA, moving or swapping them out): a packed
// convolution holds its weight only in the packed copy.
void drop_packed_weights(torch::nn::Module& module);

// Bytes held by the packed weight copies of `module`'s convolutions (0 until a forward packs).
int64_t packed_weight_bytes(const torch::nn::Module& module);

// Whether a convolution can take run-time updates (one group, zero padding of explicit size).
bool supports_low_rank(const Conv2dImpl& conv);

// While alive on this thread, the factories below leave weights and biases uninitialised in
// `dtype`. The caller must fill every parameter (load_state_dict checks that none is
// missing; init_random_weights covers every layer). Norm layers are unaffected (their
// initialisation is a cheap fill) and are converted by the model's ->to(dtype).
//
// kDeferred gives the weights of Linear, Conv2d and Embedding layers no storage at all until
// load_state_dict (or keep_quantized) gives them theirs: a placeholder of their shape over one
// element (has_deferred_storage). For a network loaded layer by layer: a 17B transformer whose
// layers stay quantized never allocates its 34 GB of plain weights only to free them, which on
// a heap of huge pages left ~3 GB resident (every freed weight's header page is a 2 MiB page).
// Nothing may read or write such a weight before it is loaded.
class SkipInitGuard {
 public:
  enum class Weights { kUninitialised, kDeferred };
  explicit SkipInitGuard(c10::ScalarType dtype, Weights weights = Weights::kUninitialised);
  ~SkipInitGuard();
  SkipInitGuard(const SkipInitGuard&) = delete;
  SkipInitGuard& operator=(const SkipInitGuard&) = delete;

 private:
  bool saved_active_, saved_deferred_;
  c10::ScalarType saved_dtype_;
};

// Whether `t` holds one element broadcast to its shape: a weight built under
// SkipInitGuard::Weights::kDeferred and not loaded yet, or a quantized layer's placeholder.
bool has_deferred_storage(const torch::Tensor& t);

Linear make_linear(const torch::nn::LinearOptions& options);
inline Linear make_linear(int64_t in, int64_t out) {
  return make_linear(torch::nn::LinearOptions(in, out));
}
Conv2d make_conv2d(const torch::nn::Conv2dOptions& options);
torch::nn::Embedding make_embedding(int64_t num_embeddings, int64_t dim);

}  // namespace diffuse::nn
