// Normalisations and GEGLU with float32 statistics in every dtype, and the norm modules the
// models use. On the CPU, bf16 inputs go through fused kernels (nn/kernels/cpu_kernels.h):
// LibTorch 1.13's bf16 CPU group_norm / layer_norm lose precision (and its channels-last bf16
// group_norm is wrong outright). float32 goes to LibTorch; other devices' native kernels
// already accumulate in float32.
#pragma once
#include <torch/nn/modules/normalization.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include <initializer_list>

namespace diffuse::nn {

// GroupNorm over x [B, C, ...] (weight, bias [C] or undefined), then SiLU if `silu`.
// With `overwrite_input` the result may be written into x's own memory (the fused kernels
// read each element before writing it): the caller promises x is not used afterwards.
torch::Tensor group_norm(const torch::Tensor& x, int64_t groups, const torch::Tensor& weight,
                         const torch::Tensor& bias, double eps, bool silu = false,
                         bool overwrite_input = false);

// LayerNorm over the last dimension (weight, bias [D] or undefined).
torch::Tensor layer_norm(const torch::Tensor& x, const torch::Tensor& weight,
                         const torch::Tensor& bias, double eps);

// RMSNorm over the last dimension: x * rsqrt(mean(x^2) + eps) * weight (weight [D] or
// undefined), statistics in float32 for every input dtype; the result has x's dtype.
// torch.nn.RMSNorm / HiDream's q/k norms; T5LayerNorm and LlamaRMSNorm are the same formula.
torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps);

// h [..., 2F] -> h[..., :F] * gelu(h[..., F:]) with the exact (erf) GELU (diffusers' GEGLU),
// after adding `bias` [2F] when defined: the projection's bias joins this pass instead of one
// of its own over the 2F-wide product.
// Contiguous bf16 CPU inputs outside autograd take a one-pass kernel (erf to 1.5e-7), and so
// do float32 ones (fused_f32_geglu); others LibTorch's ops.
torch::Tensor geglu(const torch::Tensor& h, const torch::Tensor& bias = {});
// Whether geglu takes its one-pass kernel for these float32 inputs: contiguous, on the CPU,
// outside autograd, and the attention policy is not `math`. `--attention math` is the
// reference path: there every device runs LibTorch's composite ops (it also turns the fused
// npu operators off), so that a float32 image on the cpu and on an npu compare bit for bit.
bool fused_f32_geglu(const torch::Tensor& h, const torch::Tensor& bias = {});

// Whether add_bias_residual_ and the fused GEGLU run their one-pass bf16 kernels: the
// activations contiguous bf16 on the CPU, and autograd recording none of them nor of the
// parameters (the kernels have no backward).
bool fused_bf16_epilogue(std::initializer_list<torch::Tensor> activations,
                         std::initializer_list<torch::Tensor> parameters = {});

// h += bias + residual (bias over the last dimension, may be undefined): a linear layer's
// epilogue in one pass, summed in float32 and rounded to bf16 once (LibTorch's bias add and
// the residual add are two passes and two roundings). Needs fused_bf16_epilogue({h, residual}).
void add_bias_residual_(torch::Tensor& h, const torch::Tensor& bias, const torch::Tensor& residual);

// The layout a bf16 CPU convolution network runs a [B, C, H, W] activation in: channels-last
// from 32x32 pixels up, where oneDNN convolves NHWC without reordering input and output and
// the fused norms read it directly; plain NCHW below, where oneDNN 2.x's NHWC kernels are
// 1.1-1.7x slower (SD's 8x8 and 16x16 levels with 1280-2560 channels). As is for other dtypes
// and devices. Convolutions, norms, upsampling and adds keep the layout, so the networks
// convert where a resolution starts: the VAE's input, each ResnetBlock2D's and each UNet skip
// concatenation's. Measured at 512x512: VAE decode 11% faster and 160 MB lower peak than NCHW,
// the UNet step 4% faster than all-NCHW (channels-last everywhere was 8% slower).
// DIFFUSE_CHANNELS_LAST=0 keeps NCHW everywhere (for comparisons). On CUDA the activation
// follows the layout of `conv_weight`, the convolution it feeds, which use_compute_layout set
// at load: DIFFUSE_CHANNELS_LAST=1 puts fp16/bf16 UNets channels-last there (cuDNN's tensor
// cores work in NHWC; on an H200 the UNet step under --graph went 11.7 -> 9.8 ms, while eager
// it went 13.1 -> 16.3 ms, its layout changes costing more launches than the convolutions
// saved), never a VAE (its 512x512 decode went 21.4 -> 26.7 ms).
torch::Tensor to_compute_layout(const torch::Tensor& x, const torch::Tensor& conv_weight);
// Puts a network's 4-D (convolution) weights in the layout its activations run in, once at
// load, so that a channels-last convolution does not reorder its weight at every call. A
// no-op wherever activations stay NCHW; `cuda_channels_last` false keeps a network NCHW on
// CUDA whatever DIFFUSE_CHANNELS_LAST says (the VAE).
void use_compute_layout(torch::nn::Module& module, bool cuda_channels_last = true);
// Whether to_compute_layout puts a bf16 CPU activation of this many pixels (H * W) in
// channels-last.
bool channels_last_at(int64_t pixels);

// torch::nn::GroupNorm / LayerNorm with the same parameters and names, computing through the
// functions above.
struct GroupNormImpl : torch::nn::GroupNormImpl {
  using torch::nn::GroupNormImpl::GroupNormImpl;
  torch::Tensor forward(const torch::Tensor& x) { return group_norm(x, false); }
  // Normalise, then SiLU, in one pass where the fused kernel applies.
  torch::Tensor forward_silu(const torch::Tensor& x) { return group_norm(x, true); }
  // forward_silu that may reuse x's memory for the result (x must not be used afterwards).
  torch::Tensor forward_silu_overwriting(const torch::Tensor& x) {
    return group_norm(x, true, true);
  }

 private:
  torch::Tensor group_norm(const torch::Tensor& x, bool silu, bool overwrite_input = false);
};
TORCH_MODULE(GroupNorm);

struct LayerNormImpl : torch::nn::LayerNormImpl {
  using torch::nn::LayerNormImpl::LayerNormImpl;
  torch::Tensor forward(const torch::Tensor& x);
};
TORCH_MODULE(LayerNorm);

// torch.nn.RMSNorm(dim, eps) with its parameter `weight` (ones at construction).
struct RMSNormImpl : torch::nn::Module {
  RMSNormImpl(int64_t dim, double eps);
  torch::Tensor forward(const torch::Tensor& x) { return rms_norm(x, weight, eps); }

  torch::Tensor weight;
  double eps;
};
TORCH_MODULE(RMSNorm);

}  // namespace diffuse::nn
