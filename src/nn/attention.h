// The single attention entry point of the engine. Models call nn::attention() and never a
// kernel directly, so backends are swapped by policy:
//   math   softmax(q k^T) v with the scores materialised (the reference)
//   sdpa   LibTorch's fused scaled_dot_product_attention (libtorch >= 2.0 only)
//   flash  our tiled online-softmax CPU kernel: O(N) memory, AVX-512/AVX2 with run-time dispatch
//   npu    Ascend's fused kernel, registered by the Ascend device code (attention/backends.h)
// `auto` picks per device and shape (see select_attention_backend).
#pragma once
#include <torch/types.h>

#include <optional>
#include <string>
#include <vector>

namespace diffuse::nn {

enum class AttentionBackend { kAuto, kMath, kSdpa, kFlash, kNpu };

struct AttentionOptions {
  // Softmax scale; default 1/sqrt(head_dim).
  std::optional<double> scale;
  bool causal = false;
  // Compute q·k and softmax in float32 even for bf16/fp16 inputs (diffusers' upcast_attention).
  bool upcast = false;
  // Optional additive bias, broadcastable to [B, H, Nq, Nk], added to the scaled scores before
  // the softmax (T5's relative position bias, padding masks as large negative values). Only
  // backends that declare support take it (math, sdpa); `auto` falls back to them, and an
  // explicitly chosen backend without support raises InvalidArgument.
  torch::Tensor bias;
  // kAuto: the process-wide default (set_default_attention_backend), itself auto by default.
  AttentionBackend backend = AttentionBackend::kAuto;
};

// The finite value transformers adds for masked keys (torch.finfo(dtype).min): a key-padding
// bias is (1 - mask) * this. Finite, so a row whose keys are all masked stays a (uniform)
// distribution instead of NaN.
double attention_mask_value(torch::Dtype dtype);
// [B, N] mask (1 = attend, 0 = padding) -> additive bias [B, 1, 1, N] in `dtype`.
torch::Tensor key_padding_bias(const torch::Tensor& mask, torch::Dtype dtype);

// q: [B, H, Nq, D], k and v: [B, H, Nk, D]  ->  [B, H, Nq, D], same dtype as q (possibly a
// non-contiguous view). InvalidArgument on malformed inputs, or when an explicitly chosen
// backend cannot run them (the message says why).
torch::Tensor attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                        const AttentionOptions& options = {});

// The backend attention() would run for these inputs (never kAuto).
AttentionBackend select_attention_backend(const torch::Tensor& q, const torch::Tensor& k,
                                          const torch::Tensor& v,
                                          const AttentionOptions& options = {});

// "auto", "math", ... ; InvalidArgument naming the accepted values otherwise.
AttentionBackend parse_attention_backend(const std::string& name);
const char* attention_backend_name(AttentionBackend backend);

// "" when `backend` can run on `device` in this build (kAuto always can), else why not.
std::string attention_backend_unavailable(AttentionBackend backend, const torch::Device& device);
// Backends usable on `device` (kAuto excluded).
std::vector<AttentionBackend> available_attention_backends(const torch::Device& device);

// Process-wide default used when options.backend is kAuto (set from --attention /
// DIFFUSE_ATTENTION by the front ends).
void set_default_attention_backend(AttentionBackend backend);
AttentionBackend default_attention_backend();

// `flag` if given and not "auto", else $DIFFUSE_ATTENTION, else "auto"; parsed, and checked
// against `device` (InvalidArgument naming the backend and the reason if unavailable).
AttentionBackend attention_backend_from_flag_or_env(const std::string& flag,
                                                    const torch::Device& device);

}  // namespace diffuse::nn
