// The attention backend table behind nn::attention(). Built-in backends (math, sdpa, flash)
// are registered here; device code registers accelerator kernels (the Ascend `npu` backend)
// with register_attention_backend().
//
// Registration must happen from code the program runs (e.g. when the npu device is first
// resolved), not from a static initialiser: diffuse_core is a static library, and an object
// file nothing refers to is dropped by the linker together with its initialisers.
#pragma once
#include <torch/types.h>

#include <string>

#include "nn/attention.h"

namespace diffuse::nn {

// One call, resolved: q [B, H, Nq, D], k and v [B, H, Nk, D], same device and dtype.
struct AttentionCall {
  double scale = 1.0;
  bool causal = false;  // query i sees keys j <= i (top-left aligned, as torch's is_causal)
  bool upcast = false;  // scores and softmax in float32 for low-precision inputs
  torch::Tensor bias;   // undefined, or additive, broadcastable to [B, H, Nq, Nk]
};

// Computes attention; returns [B, H, Nq, D] in q's dtype (any strides).
using AttentionRunFn = torch::Tensor (*)(const torch::Tensor& q, const torch::Tensor& k,
                                         const torch::Tensor& v, const AttentionCall& call);
// "" when the backend can run these inputs, else a short reason ("float16 inputs", ...).
using AttentionCheckFn = std::string (*)(const torch::Tensor& q, const torch::Tensor& k,
                                         const torch::Tensor& v, const AttentionCall& call);
// "" when the backend can run on this device in this build, else why not.
using AttentionDeviceFn = std::string (*)(const torch::Device& device);

struct AttentionBackendHooks {
  AttentionRunFn run = nullptr;             // required
  AttentionCheckFn unsupported = nullptr;   // optional: null = runs any input
  AttentionDeviceFn unavailable = nullptr;  // optional: null = runs on any device
  // Whether run() applies AttentionCall::bias. A backend that does not say so is never given
  // a biased call, so a kernel written before the bias existed cannot silently drop it.
  bool takes_bias = false;
};

// Installs (or replaces) the implementation of `backend`; kAuto is not a backend.
// InvalidArgument if hooks.run is null.
void register_attention_backend(AttentionBackend backend, const AttentionBackendHooks& hooks);

// InvalidArgument unless q, k, v are [B, H, Nq, D], [B, H, Nk, D], [B, H, Nk, Dv] on one
// device with one dtype.
void check_attention_inputs(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v);

// InvalidArgument unless `bias` is undefined or a floating tensor on q's device that
// broadcasts to [B, H, Nq, Nk].
void check_attention_bias(const torch::Tensor& q, const torch::Tensor& k,
                          const torch::Tensor& bias);

// Built-in backends (src/nn/attention/*.cpp).
torch::Tensor math_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                             const AttentionCall& call);
torch::Tensor sdpa_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                             const AttentionCall& call);
std::string sdpa_unavailable(const torch::Device& device);
torch::Tensor flash_attention(const torch::Tensor& q, const torch::Tensor& k,
                              const torch::Tensor& v, const AttentionCall& call);
std::string flash_unsupported(const torch::Tensor& q, const torch::Tensor& k,
                              const torch::Tensor& v, const AttentionCall& call);
std::string flash_unavailable(const torch::Device& device);

}  // namespace diffuse::nn
