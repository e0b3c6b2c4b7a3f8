#include "bench/flop_counter.h"

#include <ATen/record_function.h>
#include <torch/torch.h>

#include <cstring>

#include "diffuse/errors.h"

namespace diffuse::bench {
namespace {

// One counter per thread at a time; nested counted operators (aten::linear calling
// aten::addmm, attention's own bmm) are counted once, at the outermost level.
thread_local FlopCounts* t_counts = nullptr;
thread_local int t_count_depth = 0;

double numel(c10::IntArrayRef s) {
  double n = 1;
  for (auto d : s) n *= static_cast<double>(d);
  return n;
}

std::vector<int64_t> int_list(const c10::IValue& v) {
  if (v.isIntList()) return v.toIntVector();
  if (v.isInt()) return {v.toInt()};
  return {};
}

int64_t at_or(const std::vector<int64_t>& v, size_t i, int64_t fallback) {
  if (v.empty()) return fallback;
  return i < v.size() ? v[i] : v.back();
}

// aten::convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding,
// groups); nn::Conv2d's diffuse::conv2d_packed, diffuse::conv2d_winograd and
// diffuse::conv2d_int8 record the same arguments.
double conv_flops(c10::ArrayRef<const c10::IValue> in) {
  if (in.size() < 9 || !in[0].isTensor() || !in[1].isTensor()) return 0;
  const auto x = in[0].toTensor().sizes(), w = in[1].toTensor().sizes();
  if (x.size() < 3 || w.size() != x.size()) return 0;
  const auto stride = int_list(in[3]), padding = int_list(in[4]), dilation = int_list(in[5]);
  const bool transposed = in[6].isBool() && in[6].toBool();
  double out_spatial = 1;
  for (size_t d = 2; d < x.size(); ++d) {
    const int64_t k = w[d], s = at_or(stride, d - 2, 1), p = at_or(padding, d - 2, 0),
                  dl = at_or(dilation, d - 2, 1);
    const int64_t o = transposed ? (x[d] - 1) * s - 2 * p + dl * (k - 1) + 1
                                 : (x[d] + 2 * p - dl * (k - 1) - 1) / s + 1;
    out_spatial *= static_cast<double>(o);
  }
  // weight: [out, in / groups, k...] (transposed: [in, out / groups, k...]); every output
  // element of every output channel takes in/groups * prod(k) multiply-adds.
  const double kernel = numel(w.slice(2));
  const double out_channels = transposed
                                  ? static_cast<double>(w[1]) * (in[8].isInt() ? in[8].toInt() : 1)
                                  : static_cast<double>(w[0]);
  const double in_per_group = transposed
                                  ? static_cast<double>(w[0]) / (in[8].isInt() ? in[8].toInt() : 1)
                                  : static_cast<double>(w[1]);
  return 2.0 * static_cast<double>(x[0]) * out_channels * out_spatial * in_per_group * kernel;
}

// a [..., n, k] @ b [..., k, m] with broadcast batch dims; 1-D operands as matmul treats them.
double matmul_flops(c10::IntArrayRef a, c10::IntArrayRef b) {
  if (a.empty() || b.empty()) return 0;
  const double k = static_cast<double>(a.back());
  const double n = a.size() >= 2 ? static_cast<double>(a[a.size() - 2]) : 1;
  const double m = b.size() >= 2 ? static_cast<double>(b.back()) : 1;
  double batch = 1;
  const size_t ab = a.size() > 2 ? a.size() - 2 : 0, bb = b.size() > 2 ? b.size() - 2 : 0;
  for (size_t i = 0; i < std::max(ab, bb); ++i) {
    const int64_t da = i < ab ? a[ab - 1 - i] : 1, db = i < bb ? b[bb - 1 - i] : 1;
    batch *= static_cast<double>(std::max(da, db));
  }
  return 2.0 * batch * n * k * m;
}

const at::Tensor* tensor_at(c10::ArrayRef<const c10::IValue> in, size_t i) {
  return i < in.size() && in[i].isTensor() ? &in[i].toTensor() : nullptr;
}

struct Counted {
  double FlopCounts::*bucket = nullptr;
  double flops = 0;
  double FlopCounts::*also = nullptr;  // a second bucket the same FLOPs belong to
};

Counted classify(const at::RecordFunction& fn) {
  const char* name = fn.name();
  auto in = fn.inputs();
  auto is = [&](const char* n) { return std::strcmp(name, n) == 0; };
  if (is("diffuse::attention")) {
    const auto *q = tensor_at(in, 0), *k = tensor_at(in, 1), *v = tensor_at(in, 2);
    if (!q || !k || !v) return {&FlopCounts::attention, 0};
    const double bh = static_cast<double>(q->size(0) * q->size(1));
    const double nq = static_cast<double>(q->size(2)), nk = static_cast<double>(k->size(2));
    return {&FlopCounts::attention,
            2.0 * bh * nq * nk * static_cast<double>(q->size(3) + v->size(3))};
  }
  if (is("diffuse::conv2d_winograd"))
    return {&FlopCounts::conv, conv_flops(in), &FlopCounts::conv_winograd};
  if (is("aten::convolution") || is("diffuse::conv2d_packed") || is("diffuse::conv2d_int8"))
    return {&FlopCounts::conv, conv_flops(in)};
  if (is("aten::linear") || is("diffuse::linear_int8")) {
    const auto *x = tensor_at(in, 0), *w = tensor_at(in, 1);
    if (!x || !w) return {&FlopCounts::matmul, 0};
    return {&FlopCounts::matmul, 2.0 * numel(x->sizes()) / static_cast<double>(x->size(-1)) *
                                     static_cast<double>(w->size(0)) *
                                     static_cast<double>(w->size(1))};
  }
  if (is("aten::matmul") || is("aten::mm") || is("aten::bmm")) {
    const auto *a = tensor_at(in, 0), *b = tensor_at(in, 1);
    return {&FlopCounts::matmul, a && b ? matmul_flops(a->sizes(), b->sizes()) : 0};
  }
  if (is("aten::addmm") || is("aten::baddbmm") || is("aten::addbmm")) {
    const auto *a = tensor_at(in, 1), *b = tensor_at(in, 2);
    return {&FlopCounts::matmul, a && b ? matmul_flops(a->sizes(), b->sizes()) : 0};
  }
  return {};
}

struct DepthContext : at::ObserverContext {};

std::unique_ptr<at::ObserverContext> count_start(const at::RecordFunction& fn) {
  if (!t_counts) return nullptr;
  Counted c = classify(fn);
  if (!c.bucket) return nullptr;
  if (t_count_depth == 0) {
    (*t_counts).*c.bucket += c.flops;
    if (c.also) (*t_counts).*c.also += c.flops;
  }
  ++t_count_depth;
  return std::make_unique<DepthContext>();
}

void count_end(const at::RecordFunction&, at::ObserverContext* ctx) {
  if (ctx) --t_count_depth;
}

}  // namespace

FlopCounter::FlopCounter() {
  if (t_counts) throw InvalidArgument("FlopCounter: one is already counting on this thread");
  counts_ = std::make_unique<FlopCounts>();
  t_counts = counts_.get();
  t_count_depth = 0;
  handle_ = at::addThreadLocalCallback(
      at::RecordFunctionCallback(count_start, count_end).needsInputs(true));
}

FlopCounter::~FlopCounter() {
  at::removeCallback(handle_);
  t_counts = nullptr;
}

}  // namespace diffuse::bench
