#include "bench/op_profile.h"

#include <ATen/record_function.h>

#include <algorithm>
#include <chrono>
#include <cstring>

#include "diffuse/errors.h"

namespace diffuse::bench {
namespace {

thread_local std::map<std::string, OpTime>* t_ops = nullptr;
thread_local int t_profile_depth = 0;

struct Started : at::ObserverContext {
  std::chrono::steady_clock::time_point at;
  bool outermost = false;
};

std::unique_ptr<at::ObserverContext> profile_start(const at::RecordFunction&) {
  if (!t_ops) return nullptr;
  auto ctx = std::make_unique<Started>();
  ctx->outermost = t_profile_depth++ == 0;
  ctx->at = std::chrono::steady_clock::now();
  return ctx;
}

void profile_end(const at::RecordFunction& fn, at::ObserverContext* ctx_base) {
  if (!ctx_base || !t_ops) return;
  --t_profile_depth;
  auto* ctx = static_cast<Started*>(ctx_base);
  if (!ctx->outermost) return;
  auto& op = (*t_ops)[fn.name()];
  op.name = fn.name();
  op.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - ctx->at).count();
  op.calls += 1;
}

std::vector<OpTime> longest_first(std::vector<OpTime> v) {
  std::sort(v.begin(), v.end(),
            [](const OpTime& a, const OpTime& b) { return a.seconds > b.seconds; });
  return v;
}

bool any_of(const std::string& name, std::initializer_list<const char*> names) {
  for (const char* n : names)
    if (name == n) return true;
  return false;
}

}  // namespace

std::string OpProfile::kind_of(const std::string& op) {
  if (any_of(op, {"aten::convolution", "aten::conv2d", "aten::_convolution",
                  "aten::mkldnn_convolution", "aten::conv_transpose2d", "diffuse::conv2d_packed",
                  "diffuse::conv2d_winograd", "diffuse::conv2d_int8"}))
    return "conv";
  if (any_of(op, {"aten::linear", "diffuse::linear_int8", "aten::matmul", "aten::mm", "aten::bmm",
                  "aten::addmm", "aten::baddbmm", "aten::addbmm", "aten::einsum"}))
    return "matmul";
  if (any_of(op, {"diffuse::attention", "aten::scaled_dot_product_attention", "aten::_softmax",
                  "aten::softmax"}))
    return "attention";
  if (op.rfind("diffuse::", 0) == 0 && op.find("norm") != std::string::npos) return "norm";
  if (op.find("norm") != std::string::npos) return "norm";
  if (any_of(op, {"diffuse::geglu", "aten::gelu", "aten::silu", "aten::silu_", "aten::sigmoid",
                  "aten::tanh", "aten::relu", "aten::exp"}))
    return "activation";
  if (any_of(op, {"aten::to",         "aten::_to_copy",
                  "aten::copy_",      "aten::contiguous",
                  "aten::clone",      "aten::cat",
                  "aten::stack",      "aten::upsample_nearest2d",
                  "aten::pad",        "aten::constant_pad_nd",
                  "aten::repeat",     "aten::empty",
                  "aten::empty_like", "aten::zeros",
                  "aten::chunk",      "aten::split",
                  "aten::permute",    "aten::reshape",
                  "aten::view",       "aten::transpose",
                  "aten::flatten",    "aten::slice",
                  "aten::select",     "aten::unsqueeze",
                  "aten::expand",     "aten::narrow",
                  "aten::t",          "aten::as_strided"}))
    return "copy/layout";
  if (any_of(op, {"aten::add", "aten::add_", "aten::mul", "aten::mul_", "aten::div", "aten::div_",
                  "aten::sub", "aten::sub_", "aten::addcmul", "aten::neg", "aten::rsub",
                  "aten::pow", "aten::sqrt", "aten::rsqrt", "aten::sin", "aten::cos",
                  "aten::arange", "aten::fill_", "aten::where"}))
    return "elementwise";
  return "other";
}

OpProfile::OpProfile() {
  if (t_ops) throw InvalidArgument("OpProfile: one is already profiling this thread");
  t_ops = &ops_;
  t_profile_depth = 0;
  handle_ = at::addThreadLocalCallback(at::RecordFunctionCallback(profile_start, profile_end));
}

OpProfile::~OpProfile() {
  at::removeCallback(handle_);
  t_ops = nullptr;
}

std::vector<OpTime> OpProfile::by_kind() const {
  std::map<std::string, OpTime> kinds;
  for (const auto& [name, op] : ops_) {
    auto& k = kinds[kind_of(name)];
    k.name = kind_of(name);
    k.seconds += op.seconds;
    k.calls += op.calls;
  }
  std::vector<OpTime> out;
  for (const auto& [name, k] : kinds) out.push_back(k);
  return longest_first(out);
}

std::vector<OpTime> OpProfile::by_operator(size_t most) const {
  std::vector<OpTime> out;
  for (const auto& [name, op] : ops_) out.push_back(op);
  out = longest_first(out);
  if (out.size() > most) out.resize(most);
  return out;
}

double OpProfile::total_s() const {
  double s = 0;
  for (const auto& [name, op] : ops_) s += op.seconds;
  return s;
}

}  // namespace diffuse::bench
