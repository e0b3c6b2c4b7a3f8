#include "nn/int8_conv.h"

#include <c10/util/BFloat16.h>
#include <torch/torch.h>

#include <algorithm>
#include <string>
#include <vector>

#include "diffuse/errors.h"
#include "nn/int8_linear.h"
#include "nn/kernels/cpu_features.h"
#include "nn/kernels/cpu_kernels.h"

namespace diffuse::nn {
namespace {

int64_t output_side(int64_t in, int64_t kernel, int64_t stride, int64_t pad) {
  return (in + 2 * pad - kernel) / stride + 1;
}

// One output pixel's receptive field in the weight's (channel, ky, kx) order, zeros outside the
// image, from channels-last input `x` (one image's H x W x C values).
template <typename T>
void receptive_field(const T* x, int64_t H, int64_t W, int64_t C, const ConvGeometry& g, int64_t oy,
                     int64_t ox, float* row) {
  const int64_t taps = g.kernel_h * g.kernel_w;
  for (int64_t ky = 0; ky < g.kernel_h; ++ky) {
    const int64_t iy = oy * g.stride_h - g.pad_h + ky;
    for (int64_t kx = 0; kx < g.kernel_w; ++kx) {
      const int64_t ix = ox * g.stride_w - g.pad_w + kx;
      float* dst = row + ky * g.kernel_w + kx;
      if (iy < 0 || iy >= H || ix < 0 || ix >= W) {
        for (int64_t c = 0; c < C; ++c) dst[c * taps] = 0.0f;
        continue;
      }
      const T* src = x + (iy * W + ix) * C;
      for (int64_t c = 0; c < C; ++c) dst[c * taps] = static_cast<float>(src[c]);
    }
  }
}

}  // namespace

bool int8_conv2d_runs(const torch::Tensor& input, const quant::QuantizedWeight& w,
                      const ConvGeometry& g) {
  return w.type == quant::GgmlType::I8_ROWS && w.blocks.defined() && w.row_scales.defined() &&
         w.blocks.device().is_cpu() && input.device().is_cpu() && input.dim() == 4 &&
         (input.scalar_type() == torch::kFloat || input.scalar_type() == torch::kBFloat16) &&
         g.groups == 1 && g.dilation_h == 1 && g.dilation_w == 1 && g.kernel_h > 0 &&
         g.kernel_w > 0 && g.stride_h > 0 && g.stride_w > 0 && g.pad_h >= 0 && g.pad_w >= 0 &&
         input.size(1) * g.kernel_h * g.kernel_w == w.cols &&
         !(torch::autograd::GradMode::is_enabled() && input.requires_grad()) &&
         int8_gemm_available();
}

bool int8_conv2d_chosen(const torch::Tensor& input, const quant::QuantizedWeight& w,
                        const ConvGeometry& g) {
  if (input.scalar_type() == torch::kBFloat16 && kernels::cpu_features().amx_bf16) return false;
  return int8_conv2d_runs(input, w, g);
}

torch::Tensor int8_conv2d(const torch::Tensor& input, const quant::QuantizedWeight& w,
                          const ConvGeometry& g, const torch::Tensor& bias) {
  if (!int8_conv2d_runs(input, w, g))
    throw InvalidArgument(
        "int8_conv2d: needs an int8-rows weight of in * kh * kw = " + std::to_string(w.cols) +
        " columns, one group and no dilation, and a float32/bf16 [N, C, H, W] CPU input on a CPU "
        "with AVX512-VNNI; got " +
        c10::str(input.sizes()) + " " + c10::toString(input.scalar_type()) + " on " +
        input.device().str() + ", kernel " + std::to_string(g.kernel_h) + "x" +
        std::to_string(g.kernel_w) + ", groups " + std::to_string(g.groups));
  const int64_t N = input.size(0), C = input.size(1), H = input.size(2), W = input.size(3);
  const int64_t Ho = output_side(H, g.kernel_h, g.stride_h, g.pad_h);
  const int64_t Wo = output_side(W, g.kernel_w, g.stride_w, g.pad_w);
  if (Ho <= 0 || Wo <= 0)
    throw InvalidArgument("int8_conv2d: a " + std::to_string(H) + "x" + std::to_string(W) +
                          " input is smaller than the " + std::to_string(g.kernel_h) + "x" +
                          std::to_string(g.kernel_w) + " kernel with its padding");
  const int64_t O = w.rows, K = w.cols;
  if (bias.defined() && bias.numel() != O)
    throw InvalidArgument("int8_conv2d: a bias of " + std::to_string(bias.numel()) +
                          " values for " + std::to_string(O) + " output channels");
  const auto x = input.contiguous(torch::MemoryFormat::ChannelsLast);
  auto y =
      torch::empty({N, O, Ho, Wo}, x.options().memory_format(torch::MemoryFormat::ChannelsLast));
  const int64_t M = N * Ho * Wo;
  if (M == 0) return y;
  const auto b = bias.defined() ? bias.to(torch::kFloat).contiguous() : torch::Tensor();
  const auto& k = kernels::cpu_kernels();
  const bool bf16 = x.scalar_type() == torch::kBFloat16;
  const int64_t image = H * W * C, pixels = Ho * Wo;
  // Output pixel p's row of the product is its receptive field; the result [pixels, channels]
  // is y in channels-last order.
  auto yr = y.permute({0, 2, 3, 1}).view({M, O});
  int8_rows_product(
      M, w,
      [&](int64_t p, uint8_t* codes) {
        thread_local std::vector<float> field;
        field.resize(static_cast<size_t>(K));
        const int64_t n = p / pixels, oy = p % pixels / Wo, ox = p % Wo;
        if (bf16)
          receptive_field(x.data_ptr<at::BFloat16>() + n * image, H, W, C, g, oy, ox, field.data());
        else
          receptive_field(x.data_ptr<float>() + n * image, H, W, C, g, oy, ox, field.data());
        return k.f32_quantize_row_u8(field.data(), K, codes);
      },
      b, {}, yr);
  return y;
}

}  // namespace diffuse::nn
