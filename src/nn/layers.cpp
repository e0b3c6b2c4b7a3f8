#include "nn/layers.h"

#include <ATen/record_function.h>
#include <torch/torch.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <optional>
#include <type_traits>

#include "device/memory.h"
#include "diffuse/errors.h"
#include "nn/cpu_bf16_linear.h"
#include "nn/fused_ops.h"
#include "nn/int8_conv.h"
#include "nn/int8_linear.h"
#include "nn/winograd_conv.h"

namespace diffuse::nn {
namespace {

// The options' variants are c10::variant in libtorch 1.13 and std::variant from 2.x on:
// unqualified calls find get/get_if in either namespace by argument-dependent lookup. These
// declarations (never called) only make `get_if<T>(...)` parse as a template call in C++17.
struct NotAVariant;
template <typename T>
void get_if(NotAVariant*);
template <typename T>
void get(NotAVariant*);
template <typename T, typename V>
auto variant_get_if(V* v) {
  return get_if<T>(v);
}
template <typename T, typename V>
const T& variant_get(const V& v) {
  return get<T>(v);
}

thread_local bool t_skip_init = false;
thread_local bool t_deferred = false;
thread_local c10::ScalarType t_dtype = c10::ScalarType::Float;

torch::TensorOptions param_options() {
  return torch::TensorOptions().dtype(t_dtype);
}

// One element broadcast to `shape` (what has_deferred_storage recognises): a weight with no
// storage of its own, which keeps what readers ask (shape, dtype, device) and fails any
// in-place write (its elements share one address).
torch::Tensor broadcast_placeholder(c10::IntArrayRef shape, const torch::TensorOptions& options) {
  return torch::empty({1}, options).expand(shape);
}

// A layer's weight under the guard: uninitialised storage, or a placeholder under kDeferred.
torch::Tensor weight_storage(c10::IntArrayRef shape) {
  if (!t_deferred) return torch::empty(shape, param_options());
  return broadcast_placeholder(shape, param_options());
}

// The base classes initialise in their constructors; these build the base at a minimal size
// (a negligible initialisation), then give it its real options and uninitialised storage of
// the real shape. set_data keeps the registered parameter objects, so names are unchanged.
struct UninitLinearImpl : LinearImpl {
  explicit UninitLinearImpl(const torch::nn::LinearOptions& o)
      : LinearImpl(torch::nn::LinearOptions(1, 1).bias(o.bias())) {
    options = o;
    weight.set_data(weight_storage({o.out_features(), o.in_features()}));
    if (o.bias()) bias.set_data(torch::empty({o.out_features()}, param_options()));
  }
};

struct UninitConv2dImpl : Conv2dImpl {
  explicit UninitConv2dImpl(const torch::nn::Conv2dOptions& o) : Conv2dImpl(small(o)) {
    options.in_channels(o.in_channels())
        .out_channels(o.out_channels())
        .kernel_size(o.kernel_size());
    const auto& k = *o.kernel_size();
    weight.set_data(weight_storage({o.out_channels(), o.in_channels() / o.groups(), k[0], k[1]}));
    if (o.bias()) bias.set_data(torch::empty({o.out_channels()}, param_options()));
  }
  // Same padding, stride, dilation, groups and padding mode (what the base's reset() derives
  // state from), one input and output channel per group, 1x1 kernel.
  static torch::nn::Conv2dOptions small(const torch::nn::Conv2dOptions& o) {
    if (!variant_get_if<torch::ExpandingArray<2>>(&o.padding()))
      throw InvalidArgument("make_conv2d: only explicit padding sizes are supported");
    auto s = o;
    s.in_channels(o.groups()).out_channels(o.groups()).kernel_size(1);
    return s;
  }
};

struct UninitEmbeddingImpl : torch::nn::EmbeddingImpl {
  UninitEmbeddingImpl(int64_t n, int64_t d)
      : torch::nn::EmbeddingImpl(torch::nn::EmbeddingOptions(1, 1)) {
    options.num_embeddings(n).embedding_dim(d);
    weight.set_data(weight_storage({n, d}));
  }
};

}  // namespace

SkipInitGuard::SkipInitGuard(c10::ScalarType dtype, Weights weights)
    : saved_active_(t_skip_init), saved_deferred_(t_deferred), saved_dtype_(t_dtype) {
  t_skip_init = true;
  t_deferred = weights == Weights::kDeferred;
  t_dtype = dtype;
}

SkipInitGuard::~SkipInitGuard() {
  t_skip_init = saved_active_;
  t_deferred = saved_deferred_;
  t_dtype = saved_dtype_;
}

bool has_deferred_storage(const torch::Tensor& t) {
  if (!t.defined() || t.dim() == 0 || t.numel() <= 1) return false;
  // Dimensions of size 1 keep any stride under expand (a 1x1 convolution's [O, I, 1, 1]).
  for (int64_t d = 0; d < t.dim(); ++d)
    if (t.size(d) != 1 && t.stride(d) != 0) return false;
  return t.storage().nbytes() <= static_cast<size_t>(t.element_size());
}

namespace {

// A weight kept in its file's 16-bit dtype (load_state_dict's keep_16bit) is widened for the
// call only; widening is exact, so the layer computes what it would with float32 storage.
torch::Tensor as_input_dtype(const torch::Tensor& t, const torch::Tensor& input) {
  if (!t.defined() || t.scalar_type() == input.scalar_type()) return t;
  return t.to(input.scalar_type());
}

}  // namespace

void LinearImpl::add_low_rank(torch::Tensor& y, const torch::Tensor& input) const {
  for (const auto& u : low_rank)
    y.add_(torch::nn::functional::linear(
               torch::nn::functional::linear(input, as_input_dtype(u.down, input)),
               as_input_dtype(u.up, input)),
           u.scale);
}

torch::Tensor LinearImpl::weight_for(const torch::Tensor& input) const {
  if (quantized) return quant::dequantize_weight_for_call(*quantized, input.scalar_type());
  return as_input_dtype(weight, input);
}

void LinearImpl::keep_quantized(quant::QuantizedWeight q) {
  if (weight.dim() != 2 || q.rows != weight.size(0) || q.cols != weight.size(1))
    throw InvalidArgument("keep_quantized: blocks of a " + std::to_string(q.rows) + "x" +
                          std::to_string(q.cols) + " matrix for a weight of shape " +
                          c10::str(weight.sizes()));
  torch::NoGradGuard no_grad;
  weight.set_data(
      broadcast_placeholder(weight.sizes(), weight.options().device(q.blocks.device())));
  quantized = std::make_shared<const quant::QuantizedWeight>(std::move(q));
}

torch::Tensor LinearImpl::forward(const torch::Tensor& input) {
  if (quantized && int8_linear_chosen(input, *quantized)) {
    // The placeholder has the weight's shape: profilers and FLOP counters read it as aten::linear.
    RECORD_FUNCTION("diffuse::linear_int8", std::vector<c10::IValue>({input, weight}));
    auto y = int8_linear(input, *quantized, bias);
    add_low_rank(y, input);
    return y;
  }
  const bool plain = !quantized && weight.scalar_type() == input.scalar_type();
  const auto w = plain ? weight : weight_for(input);
  auto y = cpu_bf16_linear(input, w, bias);
  if (!y.defined())
    y = plain ? torch::nn::LinearImpl::forward(input)
              : torch::nn::functional::linear(input, w, as_input_dtype(bias, input));
  add_low_rank(y, input);
  return y;
}

torch::Tensor LinearImpl::product(const torch::Tensor& input) {
  if (quantized && int8_linear_chosen(input, *quantized)) {
    // The placeholder has the weight's shape: profilers and FLOP counters read it as aten::linear.
    RECORD_FUNCTION("diffuse::linear_int8", std::vector<c10::IValue>({input, weight}));
    auto y = int8_linear(input, *quantized, {});
    add_low_rank(y, input);
    return y;
  }
  const auto w = weight_for(input);
  auto y = cpu_bf16_linear(input, w);
  if (!y.defined()) y = torch::nn::functional::linear(input, w);
  add_low_rank(y, input);
  return y;
}

namespace {

// Every layer of kind `Layer` in `module` not quantized yet: its weight as a [rows, in / groups *
// kh * kw] matrix in `type`'s blocks where its rows are whole blocks, else left plain.
template <typename Layer>
QuantizedLayers quantize_layers_of_kind(torch::nn::Module& module, quant::GgmlType type) {
  QuantizedLayers r;
  for (const auto& item : module.named_modules()) {
    auto* layer = dynamic_cast<Layer*>(item.value().get());
    if (!layer || layer->quantized) continue;
    if constexpr (std::is_same_v<Layer, Conv2dImpl>)
      layer->drop_packed();  // the plain values back, if a packed copy held them
    const auto& w = layer->weight;
    if (w.dim() < 2 || !quant::can_keep_quantized(type, w[0].numel())) {
      ++r.kept_plain;
      continue;
    }
    auto q = quant::quantize_weight(w.reshape({w.size(0), -1}), type, item.key() + ".weight");
    r.plain_bytes += w.numel() * static_cast<int64_t>(w.element_size());
    r.quantized_bytes += q.bytes();
    layer->keep_quantized(std::move(q));
    ++r.layers;
  }
  return r;
}

}  // namespace

QuantizedLayers quantize_linear_layers(torch::nn::Module& module, quant::GgmlType type) {
  return quantize_layers_of_kind<LinearImpl>(module, type);
}

QuantizedLayers quantize_conv_layers(torch::nn::Module& module, quant::GgmlType type) {
  return quantize_layers_of_kind<Conv2dImpl>(module, type);
}

int64_t quantized_weight_bytes(const torch::nn::Module& module) {
  int64_t bytes = 0;
  for (const auto& m : module.modules())
    if (const auto* lin = dynamic_cast<const LinearImpl*>(m.get()); lin && lin->quantized)
      bytes += lin->quantized->bytes();
    else if (const auto* conv = dynamic_cast<const Conv2dImpl*>(m.get()); conv && conv->quantized)
      bytes += conv->quantized->bytes();
  return bytes;
}

int64_t resident_parameter_bytes(const torch::nn::Module& module) {
  int64_t bytes = quantized_weight_bytes(module);
  for (const auto& p : module.parameters())  // a quantized layer's placeholder holds nothing
    if (!has_deferred_storage(p)) bytes += p.numel() * p.element_size();
  return bytes;
}

torch::Tensor LinearImpl::forward_add(const torch::Tensor& input, const torch::Tensor& residual) {
  auto out_sizes = input.sizes().vec();
  if (!out_sizes.empty()) out_sizes.back() = weight.size(0);
  if (quantized && int8_linear_chosen(input, *quantized)) {
    // The placeholder has the weight's shape: profilers and FLOP counters read it as aten::linear.
    RECORD_FUNCTION("diffuse::linear_int8", std::vector<c10::IValue>({input, weight}));
    // The residual joins the integer product's epilogue where it has the output's shape.
    const bool fused =
        residual.sizes().equals(out_sizes) && residual.scalar_type() == input.scalar_type();
    auto y = int8_linear(input, *quantized, bias, fused ? residual : torch::Tensor());
    add_low_rank(y, input);
    return fused ? y : y + residual;
  }
  // A residual that broadcasts takes LibTorch's ops.
  if (!fused_bf16_epilogue({input, residual}, {weight, bias}) ||
      !residual.sizes().equals(out_sizes))
    return forward(input) + residual;
  // Our bf16 product takes the bias and the residual in its own epilogue.
  const auto w = weight_for(input);
  auto y = cpu_bf16_linear(input, w, bias, residual);
  if (y.defined()) {
    add_low_rank(y, input);
    return y;
  }
  y = torch::nn::functional::linear(input, w);
  add_low_rank(y, input);
  add_bias_residual_(y, bias, residual);
  return y;
}

bool supports_low_rank(const Conv2dImpl& conv) {
  return conv.options.groups() == 1 &&
         variant_get_if<torch::ExpandingArray<2>>(&conv.options.padding()) != nullptr &&
         variant_get_if<torch::enumtype::kZeros>(&conv.options.padding_mode()) != nullptr;
}

namespace {

// The convolution's geometry for int8_conv2d: zero padding of explicit sizes only.
std::optional<ConvGeometry> int8_geometry(const Conv2dImpl& conv) {
  const auto& o = conv.options;
  const auto* padding = variant_get_if<torch::ExpandingArray<2>>(&o.padding());
  if (!padding || !variant_get_if<torch::enumtype::kZeros>(&o.padding_mode()) ||
      conv.weight.dim() != 4)
    return std::nullopt;
  ConvGeometry g;
  g.kernel_h = conv.weight.size(2);
  g.kernel_w = conv.weight.size(3);
  g.stride_h = (*o.stride())[0];
  g.stride_w = (*o.stride())[1];
  g.pad_h = (**padding)[0];
  g.pad_w = (**padding)[1];
  g.dilation_h = (*o.dilation())[0];
  g.dilation_w = (*o.dilation())[1];
  g.groups = o.groups();
  return g;
}

}  // namespace

// aten::convolution's arguments for this call (with the plain weight): what the engine's own
// convolution paths record for profilers and FLOP counters.
std::vector<c10::IValue> convolution_arguments(const Conv2dImpl& conv, const torch::Tensor& input) {
  const auto& o = conv.options;
  return {input,
          conv.weight,
          conv.bias,
          c10::IntArrayRef(*o.stride()).vec(),
          c10::IntArrayRef(*variant_get<torch::ExpandingArray<2>>(o.padding())).vec(),
          c10::IntArrayRef(*o.dilation()).vec(),
          false,
          std::vector<int64_t>{0, 0},
          int64_t{1}};
}

// One lock for every layer's packed copy: a network shared by threads packs once.
std::mutex& packing_mutex() {
  static std::mutex m;
  return m;
}

// Set when LibTorch refuses a packed weight (a build without oneDNN, or an API change):
// every layer then takes the plain path.
std::atomic<bool> g_packing_failed{false};

torch::Tensor Conv2dImpl::packed_weight(const torch::Tensor& input) {
  if (!pack_weight || quantized || g_packing_failed.load() || !input.device().is_cpu() ||
      input.scalar_type() != torch::kBFloat16 || weight.scalar_type() != torch::kBFloat16 ||
      input.dim() != 4 || !input.is_contiguous() ||
      channels_last_at(input.size(2) * input.size(3)) || !supports_low_rank(*this) ||
      (torch::GradMode::is_enabled() && weight.requires_grad()) || !at::hasMKLDNN())
    return {};
  // Inference tensors (networks built under InferenceMode) count no versions: their in-place
  // writers call drop_packed_weights.
  const int64_t version = weight.is_inference() ? -1 : static_cast<int64_t>(weight._version());
  std::lock_guard<std::mutex> lock(packing_mutex());
  if (!packed_.defined() ||
      packed_storage_.unsafeGetStorageImpl() != weight.storage().unsafeGetStorageImpl() ||
      packed_from_ != weight.data_ptr() || packed_version_ != version) {
    drop_packed_locked();  // the stale copy (and the old storage) go before the new copy is made
    // A copy is a speed-up, never worth running short of memory: without room for it and
    // 1 GiB more, this call takes the plain path (and the next one asks again).
    constexpr int64_t kHeadroom = int64_t{1} << 30;
    const int64_t copy = weight.numel() * static_cast<int64_t>(weight.element_size());
    const int64_t available = device::host_available_bytes();
    if (available > 0 && available < copy + kHeadroom) return {};
    const auto& padding = variant_get<torch::ExpandingArray<2>>(options.padding());
    try {
      torch::NoGradGuard no_grad;
      packed_ = torch::mkldnn_reorder_conv2d_weight(weight.detach().to_mkldnn(), *padding,
                                                    *options.stride(), *options.dilation(), 1);
    } catch (const c10::Error&) {
      g_packing_failed = true;
      return {};
    }
    {
      // One copy: the weight keeps its shape, dtype and device over one element (expanded, so
      // that an in-place write without drop_packed first fails instead of going nowhere).
      torch::NoGradGuard no_grad;
      weight.set_data(torch::zeros({1}, weight.options()).expand(weight.sizes()));
      released_ = true;
    }
    device::empty_cache(torch::kCPU);
    packed_storage_ = weight.storage();
    packed_from_ = weight.data_ptr();
    packed_version_ = weight.is_inference() ? -1 : static_cast<int64_t>(weight._version());
  }
  return packed_;
}

void Conv2dImpl::drop_packed() {
  std::lock_guard<std::mutex> lock(packing_mutex());
  drop_packed_locked();
}

void Conv2dImpl::drop_packed_locked() {
  if (released_) {
    // The plain values come back unless the weight was replaced meanwhile (then the new one is
    // the weight, and the packed copy is stale).
    if (packed_.defined() &&
        packed_storage_.unsafeGetStorageImpl() == weight.storage().unsafeGetStorageImpl()) {
      torch::NoGradGuard no_grad;
      weight.set_data(packed_.to_dense().contiguous());
    }
    released_ = false;
  }
  packed_ = torch::Tensor();
  packed_storage_ = c10::Storage();
  packed_from_ = nullptr;
  packed_version_ = -1;
}

int64_t Conv2dImpl::packed_bytes() const {
  return packed_.defined() ? packed_.numel() * static_cast<int64_t>(packed_.element_size()) : 0;
}

torch::Tensor Conv2dImpl::forward(const torch::Tensor& input) {
  if (quantized && quantized->type == quant::GgmlType::I8_ROWS) {
    const auto g = int8_geometry(*this);
    if (g && int8_conv2d_chosen(input, *quantized, *g)) {
      RECORD_FUNCTION("diffuse::conv2d_int8", convolution_arguments(*this, input));
      auto y = int8_conv2d(input, *quantized, *g, bias);
      add_low_rank(y, input);
      return y;
    }
  }
  if (quantized)
    return convolve(
        input,
        quant::dequantize_weight_for_call(*quantized, input.scalar_type()).view(weight.sizes()));
  torch::Tensor y;
  if (auto packed = packed_weight(input); packed.defined()) {
    const auto& padding = variant_get<torch::ExpandingArray<2>>(options.padding());
    RECORD_FUNCTION("diffuse::conv2d_packed", convolution_arguments(*this, input));
    try {
      y = torch::mkldnn_convolution(input, packed, bias, *padding, *options.stride(),
                                    *options.dilation(), 1);
    } catch (const c10::Error&) {
      g_packing_failed = true;
    }
  }
  if (y.defined()) {
    add_low_rank(y, input);
    return y;
  }
  // The plain path needs the plain weight back if the packed copy holds it.
  if (released_) drop_packed();
  return convolve(input, weight);
}

// The convolution with `w` (the plain weight, or the dequantized one): Winograd where it
// applies, else LibTorch's path, then the low-rank updates.
torch::Tensor Conv2dImpl::convolve(const torch::Tensor& input, const torch::Tensor& w) {
  torch::Tensor y;
  if (supports_low_rank(*this)) {
    const auto& padding = variant_get<torch::ExpandingArray<2>>(options.padding());
    if (winograd_conv_applies(input, w, *options.stride(), *padding, *options.dilation(),
                              options.groups())) {
      RECORD_FUNCTION("diffuse::conv2d_winograd", convolution_arguments(*this, input));
      y = winograd_conv3x3(input, w, bias);  // widens a 16-bit weight itself
    }
  }
  // _conv_forward adds `bias`: kept in the compute dtype (only weights stay 16-bit).
  if (!y.defined())
    y = w.scalar_type() == input.scalar_type() && w.is_same(weight)
            ? torch::nn::Conv2dImpl::forward(input)
            : _conv_forward(input, as_input_dtype(w, input));
  add_low_rank(y, input);
  return y;
}

void Conv2dImpl::add_low_rank(torch::Tensor& y, const torch::Tensor& input) const {
  if (low_rank.empty()) return;
  const auto& padding = variant_get<torch::ExpandingArray<2>>(options.padding());
  for (const auto& u : low_rank) {
    auto h = torch::conv2d(input, as_input_dtype(u.down, input), {}, *options.stride(), *padding,
                           *options.dilation());
    y.add_(torch::conv2d(h, as_input_dtype(u.up, input)), u.scale);
  }
}

void Conv2dImpl::keep_quantized(quant::QuantizedWeight q) {
  const int64_t cols = weight.dim() == 4 ? weight[0].numel() : -1;
  if (q.rows != weight.size(0) || q.cols != cols)
    throw InvalidArgument("keep_quantized: blocks of a " + std::to_string(q.rows) + "x" +
                          std::to_string(q.cols) + " matrix for a convolution weight of shape " +
                          c10::str(weight.sizes()));
  drop_packed();
  torch::NoGradGuard no_grad;
  weight.set_data(
      broadcast_placeholder(weight.sizes(), weight.options().device(q.blocks.device())));
  quantized = std::make_shared<const quant::QuantizedWeight>(std::move(q));
}

void set_weight_packing(torch::nn::Module& module, bool enabled) {
  for (const auto& m : module.modules()) {
    if (auto* conv = dynamic_cast<Conv2dImpl*>(m.get())) {
      {
        std::lock_guard<std::mutex> lock(packing_mutex());
        conv->pack_weight = enabled;
      }
      if (!enabled) conv->drop_packed();  // locks itself
    }
  }
}

void drop_packed_weights(torch::nn::Module& module) {
  for (const auto& m : module.modules())
    if (auto* conv = dynamic_cast<Conv2dImpl*>(m.get())) conv->drop_packed();  // locks itself
}

int64_t packed_weight_bytes(const torch::nn::Module& module) {
  std::lock_guard<std::mutex> lock(packing_mutex());
  int64_t bytes = 0;
  for (const auto& m : module.modules())
    if (const auto* conv = dynamic_cast<const Conv2dImpl*>(m.get())) bytes += conv->packed_bytes();
  return bytes;
}

std::set<std::string> layer_weight_names(const torch::nn::Module& module) {
  std::set<std::string> names;
  for (const auto& item : module.named_modules()) {
    const auto* m = item.value().get();
    if (dynamic_cast<const LinearImpl*>(m) || dynamic_cast<const Conv2dImpl*>(m))
      names.insert(item.key().empty() ? "weight" : item.key() + ".weight");
  }
  return names;
}

Linear make_linear(const torch::nn::LinearOptions& options) {
  if (!t_skip_init) return Linear(options);
  return Linear(std::shared_ptr<LinearImpl>(std::make_shared<UninitLinearImpl>(options)));
}

Conv2d make_conv2d(const torch::nn::Conv2dOptions& options) {
  if (!t_skip_init) return Conv2d(options);
  return Conv2d(std::shared_ptr<Conv2dImpl>(std::make_shared<UninitConv2dImpl>(options)));
}

torch::nn::Embedding make_embedding(int64_t num_embeddings, int64_t dim) {
  if (!t_skip_init) return torch::nn::Embedding(num_embeddings, dim);
  return torch::nn::Embedding(std::shared_ptr<torch::nn::EmbeddingImpl>(
      std::make_shared<UninitEmbeddingImpl>(num_embeddings, dim)));
}

}  // namespace diffuse::nn
