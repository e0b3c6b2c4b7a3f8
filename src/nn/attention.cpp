#include "nn/attention.h"

#include <ATen/record_function.h>
#include <torch/torch.h>

#include <array>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <limits>

#include "diffuse/errors.h"
#include "nn/attention/backends.h"

namespace diffuse::nn {
namespace {

constexpr size_t kBackends = 5;  // indexed by AttentionBackend

struct Slot {
  std::atomic<AttentionRunFn> run{nullptr};
  std::atomic<AttentionCheckFn> unsupported{nullptr};
  std::atomic<AttentionDeviceFn> unavailable{nullptr};
  std::atomic<bool> takes_bias{false};
};

std::string npu_not_registered(const torch::Device&) {
  return "no npu attention kernel is registered (this build has no Ascend support)";
}

std::array<Slot, kBackends>& table() {
  static std::array<Slot, kBackends> slots;
  static const bool init = [] {
    slots[static_cast<size_t>(AttentionBackend::kMath)].run = math_attention;
    slots[static_cast<size_t>(AttentionBackend::kMath)].takes_bias = true;
    slots[static_cast<size_t>(AttentionBackend::kSdpa)].run = sdpa_attention;
    slots[static_cast<size_t>(AttentionBackend::kSdpa)].unavailable = sdpa_unavailable;
    slots[static_cast<size_t>(AttentionBackend::kSdpa)].takes_bias = true;
    slots[static_cast<size_t>(AttentionBackend::kFlash)].run = flash_attention;
    slots[static_cast<size_t>(AttentionBackend::kFlash)].unsupported = flash_unsupported;
    slots[static_cast<size_t>(AttentionBackend::kFlash)].unavailable = flash_unavailable;
    slots[static_cast<size_t>(AttentionBackend::kNpu)].unavailable = npu_not_registered;
    return true;
  }();
  (void)init;
  return slots;
}

Slot& slot(AttentionBackend b) {
  return table()[static_cast<size_t>(b)];
}

std::atomic<AttentionBackend> g_default{AttentionBackend::kAuto};

std::string unsupported_reason(AttentionBackend b, const torch::Tensor& q, const torch::Tensor& k,
                               const torch::Tensor& v, const AttentionCall& call) {
  std::string why = attention_backend_unavailable(b, q.device());
  if (!why.empty()) return why;
  if (call.bias.defined() && !slot(b).takes_bias.load())
    return "it takes no additive attention bias";
  AttentionCheckFn check = slot(b).unsupported.load();
  return check ? check(q, k, v, call) : "";
}

bool can_run(AttentionBackend b, const torch::Tensor& q, const torch::Tensor& k,
             const torch::Tensor& v, const AttentionCall& call) {
  return unsupported_reason(b, q, k, v, call).empty();
}

// The auto policy. Accelerators: their fused kernel when there is one. CPU: flash for every
// input it takes: `diffuse bench attention` measured it faster than math on every shape, from
// 77-token causal text attention and 77-key cross-attention to 9216-token self-attention, in
// float32 and bf16 (1.4-3x), with O(N) instead of O(N^2) memory.
AttentionBackend choose_auto(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                             const AttentionCall& call) {
  const auto& dev = q.device();
  if (dev.type() == c10::DeviceType::PrivateUse1 && can_run(AttentionBackend::kNpu, q, k, v, call))
    return AttentionBackend::kNpu;
  if (!dev.is_cpu())
    return can_run(AttentionBackend::kSdpa, q, k, v, call) ? AttentionBackend::kSdpa
                                                           : AttentionBackend::kMath;
  if (can_run(AttentionBackend::kFlash, q, k, v, call)) return AttentionBackend::kFlash;
  return AttentionBackend::kMath;
}

AttentionCall make_call(const torch::Tensor& q, const AttentionOptions& options) {
  AttentionCall call;
  call.scale = options.scale.value_or(1.0 / std::sqrt(static_cast<double>(q.size(3))));
  call.causal = options.causal;
  call.upcast = options.upcast;
  call.bias = options.bias;
  return call;
}

AttentionBackend select(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                        const AttentionOptions& options, const AttentionCall& call) {
  AttentionBackend b =
      options.backend == AttentionBackend::kAuto ? g_default.load() : options.backend;
  return b == AttentionBackend::kAuto ? choose_auto(q, k, v, call) : b;
}

}  // namespace

void check_attention_inputs(const torch::Tensor& q, const torch::Tensor& k,
                            const torch::Tensor& v) {
  if (!q.defined() || !k.defined() || !v.defined())
    throw InvalidArgument("attention: q, k and v must all be defined");
  if (q.dim() != 4 || k.dim() != 4 || v.dim() != 4)
    throw InvalidArgument("attention: q, k, v must be 4-D [batch, heads, tokens, head_dim], got " +
                          c10::str(q.sizes()) + ", " + c10::str(k.sizes()) + ", " +
                          c10::str(v.sizes()));
  if (k.size(0) != q.size(0) || v.size(0) != q.size(0) || k.size(1) != q.size(1) ||
      v.size(1) != q.size(1))
    throw InvalidArgument("attention: batch and heads of q " + c10::str(q.sizes()) + ", k " +
                          c10::str(k.sizes()) + " and v " + c10::str(v.sizes()) + " differ");
  if (k.size(3) != q.size(3))
    throw InvalidArgument("attention: q and k head dims differ (" + std::to_string(q.size(3)) +
                          " vs " + std::to_string(k.size(3)) + ")");
  if (v.size(2) != k.size(2))
    throw InvalidArgument("attention: k has " + std::to_string(k.size(2)) + " tokens but v has " +
                          std::to_string(v.size(2)));
  if (k.device() != q.device() || v.device() != q.device())
    throw InvalidArgument("attention: q, k and v are on different devices");
  if (k.scalar_type() != q.scalar_type() || v.scalar_type() != q.scalar_type())
    throw InvalidArgument("attention: q, k and v have different dtypes");
}

double attention_mask_value(torch::Dtype dtype) {
  switch (dtype) {
    case torch::kFloat64:
      return std::numeric_limits<double>::lowest();
    case torch::kHalf:
      return static_cast<double>(std::numeric_limits<c10::Half>::lowest());
    case torch::kBFloat16:
      return static_cast<double>(std::numeric_limits<c10::BFloat16>::lowest());
    default:
      return static_cast<double>(std::numeric_limits<float>::lowest());
  }
}

torch::Tensor key_padding_bias(const torch::Tensor& mask, torch::Dtype dtype) {
  if (mask.dim() != 2)
    throw InvalidArgument("attention mask must be [batch, tokens], got " + c10::str(mask.sizes()));
  return ((1.0 - mask.to(dtype)) * attention_mask_value(dtype))
      .view({mask.size(0), 1, 1, mask.size(1)});
}

void check_attention_bias(const torch::Tensor& q, const torch::Tensor& k,
                          const torch::Tensor& bias) {
  if (!bias.defined()) return;
  const std::vector<int64_t> full = {q.size(0), q.size(1), q.size(2), k.size(2)};
  bool ok = bias.dim() <= 4 && bias.device() == q.device() && bias.is_floating_point();
  for (int64_t i = 0; ok && i < bias.dim(); ++i) {
    const int64_t want = full[static_cast<size_t>(4 - bias.dim() + i)];
    ok = bias.size(i) == want || bias.size(i) == 1;
  }
  if (!ok)
    throw InvalidArgument("attention: bias " + c10::str(bias.sizes()) + " (" +
                          c10::toString(bias.scalar_type()) + ", " + bias.device().str() +
                          ") must be a floating tensor on q's device broadcastable to " +
                          c10::str(full));
}

void register_attention_backend(AttentionBackend backend, const AttentionBackendHooks& hooks) {
  if (backend == AttentionBackend::kAuto)
    throw InvalidArgument("cannot register a kernel for 'auto'");
  if (!hooks.run) throw InvalidArgument("register_attention_backend: run is null");
  Slot& s = slot(backend);
  s.unsupported = hooks.unsupported;
  s.unavailable = hooks.unavailable;
  s.takes_bias = hooks.takes_bias;
  s.run = hooks.run;
}

torch::Tensor attention(const torch::Tensor& q_in, const torch::Tensor& k_in,
                        const torch::Tensor& v_in, const AttentionOptions& options) {
  torch::Tensor q = q_in, k = k_in, v = v_in;
  // Training under bf16 autocast mixes float32 (norms, RoPE) with bf16 (projections): attend
  // in the narrower type, as autocast's matmuls would. Elsewhere a mix stays an error.
  if (q.defined() && k.defined() && v.defined() && torch::GradMode::is_enabled() &&
      (q.scalar_type() != v.scalar_type() || k.scalar_type() != v.scalar_type())) {
    auto narrow = q.scalar_type();
    for (const auto* t : {&k, &v})
      if (static_cast<size_t>(t->element_size()) < c10::elementSize(narrow))
        narrow = t->scalar_type();
    q = q.to(narrow);
    k = k.to(narrow);
    v = v.to(narrow);
  }
  check_attention_inputs(q, k, v);
  check_attention_bias(q, k, options.bias);
  // Visible to profilers and to bench::FlopCounter, whatever kernel runs below.
  RECORD_FUNCTION("diffuse::attention", std::vector<c10::IValue>({q, k, v}));
  const AttentionCall call = make_call(q, options);
  AttentionBackend b = select(q, k, v, options, call);
  // The flash kernel has no backward: while autograd records (training), math computes the
  // same attention differentiably.
  if (b == AttentionBackend::kFlash && torch::GradMode::is_enabled() &&
      (q.requires_grad() || k.requires_grad() || v.requires_grad()))
    b = AttentionBackend::kMath;
  std::string why = unsupported_reason(b, q, k, v, call);
  if (!why.empty())
    throw InvalidArgument(std::string("attention backend '") + attention_backend_name(b) +
                          "' cannot run this call: " + why);
  return slot(b).run.load()(q, k, v, call);
}

AttentionBackend select_attention_backend(const torch::Tensor& q, const torch::Tensor& k,
                                          const torch::Tensor& v, const AttentionOptions& options) {
  check_attention_inputs(q, k, v);
  return select(q, k, v, options, make_call(q, options));
}

AttentionBackend parse_attention_backend(const std::string& name) {
  if (name == "auto") return AttentionBackend::kAuto;
  if (name == "math") return AttentionBackend::kMath;
  if (name == "sdpa") return AttentionBackend::kSdpa;
  if (name == "flash") return AttentionBackend::kFlash;
  if (name == "npu") return AttentionBackend::kNpu;
  throw InvalidArgument("unknown attention backend '" + name +
                        "' (expected auto|math|sdpa|flash|npu)");
}

const char* attention_backend_name(AttentionBackend backend) {
  switch (backend) {
    case AttentionBackend::kAuto:
      return "auto";
    case AttentionBackend::kMath:
      return "math";
    case AttentionBackend::kSdpa:
      return "sdpa";
    case AttentionBackend::kFlash:
      return "flash";
    case AttentionBackend::kNpu:
      return "npu";
  }
  return "?";
}

std::string attention_backend_unavailable(AttentionBackend backend, const torch::Device& device) {
  if (backend == AttentionBackend::kAuto) return "";
  Slot& s = slot(backend);
  AttentionDeviceFn check = s.unavailable.load();
  std::string why = check ? check(device) : "";
  if (why.empty() && !s.run.load()) why = "no kernel is registered";
  return why;
}

std::vector<AttentionBackend> available_attention_backends(const torch::Device& device) {
  std::vector<AttentionBackend> out;
  for (auto b : {AttentionBackend::kMath, AttentionBackend::kSdpa, AttentionBackend::kFlash,
                 AttentionBackend::kNpu})
    if (attention_backend_unavailable(b, device).empty()) out.push_back(b);
  return out;
}

void set_default_attention_backend(AttentionBackend backend) {
  g_default = backend;
}
AttentionBackend default_attention_backend() {
  return g_default.load();
}

AttentionBackend attention_backend_from_flag_or_env(const std::string& flag,
                                                    const torch::Device& device) {
  std::string name = flag;
  if (name.empty() || name == "auto") {
    const char* env = std::getenv("DIFFUSE_ATTENTION");
    name = env && *env ? env : "auto";
  }
  AttentionBackend b = parse_attention_backend(name);
  std::string why = attention_backend_unavailable(b, device);
  if (!why.empty())
    throw InvalidArgument("attention backend '" + name + "' is not available on " + device.str() +
                          ": " + why);
  return b;
}

}  // namespace diffuse::nn
