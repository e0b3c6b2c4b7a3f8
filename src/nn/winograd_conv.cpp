#include "nn/winograd_conv.h"

#include <ATen/Parallel.h>
#include <torch/torch.h>

#include <atomic>
#include <cstdlib>
#include <string>
#include <vector>

#include "diffuse/errors.h"
#include "nn/attention.h"
#include "nn/kernels/cpu_features.h"

namespace diffuse::nn {
namespace {

// Below these the direct convolution wins or ties (AVX2 EPYC, 2 threads, float32, against
// oneDNN with the weight widened from float16 per call as the pipeline runs it): with batch 2,
// 8x8 outputs (32 tiles) at 1280 channels ran 0.9x, 16x16 (128 tiles) 1.4-1.6x, 32x32 and
// 64x64 1.3-1.7x. Few tiles leave the 16 products too thin for BLAS, and few channels leave
// the transforms, which do not shrink with them, as the larger part.
constexpr int64_t kMinTiles = 128;
constexpr int64_t kMinChannels = 32;
// The transformed input and products of one pass over the tiles (16 * (C + O) floats per
// tile) stay under this; larger images run in several passes of whole tile rows.
constexpr int64_t kChunkBytes = int64_t{64} << 20;

std::atomic<int> g_enabled{-1};  // -1: not set, DIFFUSE_WINOGRAD decides

bool enabled_by_environment() {
  static const bool enabled = [] {
    const char* env = std::getenv("DIFFUSE_WINOGRAD");
    return !(env && std::string(env) == "0");
  }();
  return enabled;
}

// A plane stride of n floats or more that is 16 floats (one cache line) past a multiple of
// 1024 (4 KiB): the 16 planes a transform writes at once then start in 16 different L1 sets.
int64_t plane_stride(int64_t n) {
  return (n + 1023) / 1024 * 1024 + 16;
}

float* floats(torch::Tensor& t) {
  return t.data_ptr<float>();
}

}  // namespace

bool winograd_enabled() {
  const int set = g_enabled.load();
  return set < 0 ? enabled_by_environment() : set != 0;
}

void set_winograd_enabled(bool enabled) {
  g_enabled = enabled ? 1 : 0;
}

bool winograd_conv_applies(const torch::Tensor& input, const torch::Tensor& weight,
                           c10::IntArrayRef stride, c10::IntArrayRef padding,
                           c10::IntArrayRef dilation, int64_t groups) {
  auto all = [](c10::IntArrayRef values, int64_t v) {
    for (auto x : values)
      if (x != v) return false;
    return values.size() == 2;
  };
  if (!winograd_enabled() || !input.device().is_cpu() || input.scalar_type() != torch::kFloat32 ||
      input.dim() != 4 || !input.is_contiguous() || weight.dim() != 4 || weight.size(2) != 3 ||
      weight.size(3) != 3 || groups != 1 || !all(stride, 1) || !all(padding, 1) ||
      !all(dilation, 1) || weight.size(1) != input.size(1))
    return false;
  if (torch::GradMode::is_enabled() && (input.requires_grad() || weight.requires_grad()))
    return false;
  if (default_attention_backend() == AttentionBackend::kMath) return false;
  const int64_t tiles = input.size(0) * ((input.size(2) + 1) / 2) * ((input.size(3) + 1) / 2);
  return tiles >= kMinTiles && input.size(1) >= kMinChannels && weight.size(0) >= kMinChannels;
}

torch::Tensor winograd_conv3x3(const torch::Tensor& input, const torch::Tensor& weight_in,
                               const torch::Tensor& bias_in) {
  if (!input.device().is_cpu() || input.scalar_type() != torch::kFloat32 || input.dim() != 4 ||
      !input.is_contiguous() || weight_in.dim() != 4 || weight_in.size(2) != 3 ||
      weight_in.size(3) != 3 || weight_in.size(1) != input.size(1) ||
      weight_in.scalar_type() != torch::kFloat32 || !weight_in.device().is_cpu())
    throw InvalidArgument(
        "winograd_conv3x3 takes a contiguous float32 CPU input [B, C, H, W] and a float32 "
        "weight [O, C, 3, 3]; got input " +
        std::string(c10::toString(input.scalar_type())) + " " + c10::str(input.sizes()) +
        " and weight " + c10::toString(weight_in.scalar_type()) + " " +
        c10::str(weight_in.sizes()));
  const int64_t B = input.size(0), C = input.size(1), H = input.size(2), W = input.size(3);
  const int64_t O = weight_in.size(0);
  torch::Tensor bias;
  if (bias_in.defined()) {
    if (bias_in.numel() != O)
      throw InvalidArgument("winograd_conv3x3: bias has " + std::to_string(bias_in.numel()) +
                            " values for " + std::to_string(O) + " output channels");
    bias = bias_in.to(torch::kFloat32).contiguous();
  }
  auto y = torch::empty({B, O, H, W}, input.options());
  if (y.numel() == 0) return y;
  if (C == 0) return bias.defined() ? y.copy_(bias.view({1, O, 1, 1}).expand_as(y)) : y.zero_();

  const auto& kern = kernels::cpu_kernels();
  const auto weight = weight_in.contiguous();
  const float* wp = weight.data_ptr<float>();
  const float* bp = bias.defined() ? bias.data_ptr<float>() : nullptr;
  const float* xp = input.data_ptr<float>();
  float* yp = floats(y);

  const int64_t u_plane = plane_stride(O * C);
  auto U = torch::empty({16 * u_plane}, input.options());
  float* up = floats(U);
  at::parallel_for(0, O, 1, [&](int64_t o0, int64_t o1) {
    std::vector<float> scratch(9 * C);
    kern.f32_winograd_weights(wp, o0, o1, C, up, u_plane, scratch.data());
  });

  const int64_t TH = (H + 1) / 2, TW = (W + 1) / 2, rows = B * TH;
  const int64_t row_bytes = 16 * (C + O) * TW * static_cast<int64_t>(sizeof(float));
  const int64_t chunk_rows = std::max<int64_t>(1, std::min(rows, kChunkBytes / row_bytes));
  const int64_t ld = chunk_rows * TW;
  const int64_t v_plane = plane_stride(C * ld), m_plane = plane_stride(O * ld);
  auto V = torch::empty({16 * v_plane}, input.options());
  auto M = torch::empty({16 * m_plane}, input.options());
  float* vp = floats(V);
  float* mp = floats(M);

  for (int64_t r0 = 0; r0 < rows; r0 += chunk_rows) {
    const int64_t r1 = std::min(rows, r0 + chunk_rows), n = (r1 - r0) * TW;
    // Each image's tile rows inside [r0, r1): ty0..ty1 of image b at column t0.
    auto for_images = [&](auto&& body) {
      for (int64_t b = r0 / TH; b * TH < r1; ++b) {
        const int64_t ty0 = std::max(r0, b * TH) - b * TH,
                      ty1 = std::min(r1, (b + 1) * TH) - b * TH;
        body(b, ty0, ty1, (b * TH + ty0 - r0) * TW);
      }
    };
    at::parallel_for(0, C, 1, [&](int64_t c0, int64_t c1) {
      std::vector<float> scratch(8 * (TW + 2) + W);
      for_images([&](int64_t b, int64_t ty0, int64_t ty1, int64_t t0) {
        kern.f32_winograd_input(xp + b * C * H * W, c0, c1, H, W, ty0, ty1, vp, v_plane, ld, t0,
                                scratch.data());
      });
    });
    for (int64_t k = 0; k < 16; ++k) {
      auto m = M.as_strided({O, n}, {ld, 1}, k * m_plane);
      at::mm_out(m, U.as_strided({O, C}, {C, 1}, k * u_plane),
                 V.as_strided({C, n}, {ld, 1}, k * v_plane));
    }
    at::parallel_for(0, O, 1, [&](int64_t o0, int64_t o1) {
      std::vector<float> scratch(4 * TW);
      for_images([&](int64_t b, int64_t ty0, int64_t ty1, int64_t t0) {
        kern.f32_winograd_output(mp, o0, o1, m_plane, ld, t0, bp, H, W, ty0, ty1,
                                 yp + b * O * H * W, scratch.data());
      });
    });
  }
  return y;
}

}  // namespace diffuse::nn
