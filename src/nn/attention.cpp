#include "nn/attention.h"

#include <torch/torch.h>

#include <atomic>
#include <cmath>
#include <map>
#include <mutex>

#include "diffuse/errors.h"

namespace diffuse::nn {
namespace {

std::atomic<AttentionBackend> g_default{AttentionBackend::kAuto};

struct Registered {
  AttentionKernel kernel = nullptr;
  AttentionSupports supports = nullptr;
};

std::mutex g_registry_mu;

std::map<AttentionBackend, Registered>& registry() {
  static std::map<AttentionBackend, Registered> r;
  return r;
}

Registered find_registered(AttentionBackend backend) {
  std::lock_guard<std::mutex> lock(g_registry_mu);
  auto it = registry().find(backend);
  return it == registry().end() ? Registered{} : it->second;
}

// The reference: softmax(scale * q k^T) v, as diffusers' AttnProcessor computes it.
torch::Tensor math_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                             double scale, bool causal, bool upcast) {
  auto B = q.size(0), H = q.size(1), Nq = q.size(2), D = q.size(3), Nk = k.size(2);
  auto dtype = q.scalar_type();
  auto q3 = q.reshape({B * H, Nq, D});
  auto k3 = k.reshape({B * H, Nk, D});
  auto v3 = v.reshape({B * H, Nk, v.size(3)});
  if (upcast) {
    q3 = q3.to(torch::kFloat32);
    k3 = k3.to(torch::kFloat32);
  }
  // Not baddbmm(empty, q, k^T, beta=0, alpha=scale) as diffusers writes it: libtorch 1.13's
  // CPU kernel for small matrices reads the uninitialised input despite beta=0 and
  // intermittently yields NaN. bmm then an in-place scale rounds the same way.
  auto scores = torch::bmm(q3, k3.transpose(1, 2)).mul_(scale);
  if (causal) {
    auto mask = torch::ones({Nq, Nk}, torch::TensorOptions().dtype(torch::kBool)).triu(1);
    scores = scores.masked_fill(mask.to(scores.device()), -std::numeric_limits<float>::infinity());
  }
  auto probs = scores.softmax(-1).to(v3.scalar_type());
  auto out = torch::bmm(probs, v3);
  return out.reshape({B, H, Nq, v.size(3)}).to(dtype);
}

}  // namespace

torch::Tensor attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                        const AttentionOptions& options) {
  if (q.dim() != 4 || k.dim() != 4 || v.dim() != 4)
    throw InvalidArgument("attention: q, k, v must be 4-D [batch, heads, tokens, head_dim]");
  double scale = options.scale.value_or(1.0 / std::sqrt(static_cast<double>(q.size(3))));
  AttentionBackend backend = options.backend == AttentionBackend::kAuto ? g_default.load() : options.backend;
  // On the npu device, auto means the fused kernel where it takes these inputs.
  if (backend == AttentionBackend::kAuto && q.device().type() == c10::DeviceType::PrivateUse1)
    backend = AttentionBackend::kNpu;
  if (backend == AttentionBackend::kNpu) {
    Registered r = find_registered(backend);
    AttentionOptions resolved = options;
    resolved.scale = scale;
    if (r.kernel && (!r.supports || r.supports(q, resolved))) return r.kernel(q, k, v, resolved);
    backend = AttentionBackend::kMath;
  }
  switch (backend) {
    case AttentionBackend::kAuto:
    case AttentionBackend::kMath:
    default:
      return math_attention(q, k, v, scale, options.causal, options.upcast);
  }
}

AttentionBackend parse_attention_backend(const std::string& name) {
  if (name == "auto") return AttentionBackend::kAuto;
  if (name == "math") return AttentionBackend::kMath;
  if (name == "sdpa") return AttentionBackend::kSdpa;
  if (name == "flash") return AttentionBackend::kFlash;
  if (name == "npu") return AttentionBackend::kNpu;
  throw InvalidArgument("unknown attention backend '" + name + "' (expected auto|math|sdpa|flash|npu)");
}

const char* attention_backend_name(AttentionBackend backend) {
  switch (backend) {
    case AttentionBackend::kAuto: return "auto";
    case AttentionBackend::kMath: return "math";
    case AttentionBackend::kSdpa: return "sdpa";
    case AttentionBackend::kFlash: return "flash";
    case AttentionBackend::kNpu: return "npu";
  }
  return "?";
}

void set_default_attention_backend(AttentionBackend backend) { g_default = backend; }

void register_attention_backend(AttentionBackend backend, AttentionKernel kernel, AttentionSupports supports) {
  std::lock_guard<std::mutex> lock(g_registry_mu);
  registry()[backend] = Registered{kernel, supports};
}

AttentionBackend default_attention_backend() { return g_default.load(); }

}  // namespace diffuse::nn
