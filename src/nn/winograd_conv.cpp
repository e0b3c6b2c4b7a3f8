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

// Where the Winograd path pays, measured side by side with oneDNN's direct convolution (AVX2
// EPYC, float32, 2 threads, the weight widened from float16 per call as the pipeline runs it;
// speed-up F(2x2) / F(4x4)): with batch 2, SD2.1's 8x8 level (1280 channels, 32 2x2 tiles)
// 0.98x / 0.55x; 16x16 (128 2x2 tiles) 1.37-1.46x / 0.83-0.96x; 32x32 at 640 channels
// 1.42-1.51x / 1.63-1.80x; 64x64 at 320 1.21-1.43x / 1.81-1.86x; the VAE's decoder (batch 1)
// at 512 channels 1.42-1.62x / 1.83-2.31x, 256 at 256x256 1.34x / 2.06x, 128 at 512x512
// 1.00x / 1.98x. With few channels the 16 or 36 products are too small to run well on 2
// threads (64 channels at 64x64: 0.51x / 0.57x; 256 at 16x16: 0.39x / 0.44x). So a tile needs
// kMinTiles tiles in the batch, and each product of a pass kMinProductFlops.
constexpr int64_t kMinTiles = 128;
constexpr double kMinProductFlops = 32e6;
constexpr int64_t kMinChannels = 32;
// The transformed input and products of one pass over the tiles ((m + 2)^2 * (C + O) floats
// per tile) stay under this; larger images run in several passes of whole tile rows.
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
// 1024 (4 KiB): the 16 or 36 planes a transform writes at once then start in as many L1 sets.
int64_t plane_stride(int64_t n) {
  return (n + 1023) / 1024 * 1024 + 16;
}

float* floats(torch::Tensor& t) {
  return t.data_ptr<float>();
}

// F(m x m, 3x3): its output tile, number of planes and transforms.
struct Variant {
  int64_t m, planes;
  kernels::WinogradWeights weights;
  kernels::WinogradInput input;
  kernels::WinogradOutput output;
};

int64_t tiles(int64_t B, int64_t H, int64_t W, int64_t m) {
  return B * ((H + m - 1) / m) * ((W + m - 1) / m);
}

// Tile rows per pass for F(m x m) over B images: the most whose transformed tiles fit
// kChunkBytes, at least one.
int64_t rows_per_pass(int64_t B, int64_t C, int64_t O, int64_t H, int64_t W, int64_t m) {
  const int64_t TW = (W + m - 1) / m, rows = B * ((H + m - 1) / m);
  const int64_t row_bytes = (m + 2) * (m + 2) * (C + O) * TW * static_cast<int64_t>(sizeof(float));
  return std::max<int64_t>(1, std::min(rows, kChunkBytes / row_bytes));
}

// The output tile that pays for this convolution (see kMinTiles): 4, else 2, else 0 (the
// direct convolution).
int64_t output_tile(int64_t B, int64_t C, int64_t O, int64_t H, int64_t W) {
  if (C < kMinChannels || O < kMinChannels) return 0;
  for (int64_t m : {4, 2}) {
    const int64_t n = rows_per_pass(B, C, O, H, W, m) * ((W + m - 1) / m);
    if (tiles(B, H, W, m) >= kMinTiles && 2.0 * O * C * n >= kMinProductFlops) return m;
  }
  return 0;
}

// Whether the input [B, C, H, W] and the weight [O, C, 3, 3] have the layout, dtype and
// shapes the transforms take (float32 contiguous CPU input, a floating-point CPU weight).
bool takes_shapes(const torch::Tensor& input, const torch::Tensor& weight) {
  return input.device().is_cpu() && input.scalar_type() == torch::kFloat32 && input.dim() == 4 &&
         input.is_contiguous() && weight.dim() == 4 && weight.size(2) == 3 && weight.size(3) == 3 &&
         weight.size(1) == input.size(1) && weight.is_floating_point() && weight.device().is_cpu();
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
  if (!winograd_enabled() || !takes_shapes(input, weight) || groups != 1 || !all(stride, 1) ||
      !all(padding, 1) || !all(dilation, 1))
    return false;
  if (torch::GradMode::is_enabled() && (input.requires_grad() || weight.requires_grad()))
    return false;
  if (default_attention_backend() == AttentionBackend::kMath) return false;
  return output_tile(input.size(0), input.size(1), weight.size(0), input.size(2), input.size(3)) !=
         0;
}

torch::Tensor winograd_conv3x3(const torch::Tensor& input, const torch::Tensor& weight_in,
                               const torch::Tensor& bias_in, int64_t tile_size) {
  if (tile_size != 0 && tile_size != 2 && tile_size != 4)
    throw InvalidArgument("winograd_conv3x3: output tile " + std::to_string(tile_size) +
                          " (expected 2, 4, or 0 to choose)");
  if (!takes_shapes(input, weight_in))
    throw InvalidArgument(
        "winograd_conv3x3 takes a contiguous float32 CPU input [B, C, H, W] and a floating-point "
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
  const int64_t m = tile_size != 0 ? tile_size : std::max<int64_t>(2, output_tile(B, C, O, H, W));
  const Variant v = m == 4 ? Variant{4, 36, kern.f32_winograd4_weights, kern.f32_winograd4_input,
                                     kern.f32_winograd4_output}
                           : Variant{2, 16, kern.f32_winograd_weights, kern.f32_winograd_input,
                                     kern.f32_winograd_output};
  // Widened for the call (exact), as nn::Conv2d does for the direct convolution.
  const auto weight = weight_in.to(torch::kFloat32).contiguous();
  const float* wp = weight.data_ptr<float>();
  const float* bp = bias.defined() ? bias.data_ptr<float>() : nullptr;
  const float* xp = input.data_ptr<float>();
  float* yp = floats(y);

  const int64_t u_plane = plane_stride(O * C);
  auto U = torch::empty({v.planes * u_plane}, input.options());
  float* up = floats(U);
  at::parallel_for(0, O, 1, [&](int64_t o0, int64_t o1) {
    std::vector<float> scratch(9 * C);
    v.weights(wp, o0, o1, C, up, u_plane, scratch.data());
  });

  const int64_t TH = (H + m - 1) / m, TW = (W + m - 1) / m, rows = B * TH;
  const int64_t chunk_rows = rows_per_pass(B, C, O, H, W, m);
  const int64_t ld = chunk_rows * TW;
  const int64_t v_plane = plane_stride(C * ld), m_plane = plane_stride(O * ld);
  auto V = torch::empty({v.planes * v_plane}, input.options());
  auto M = torch::empty({v.planes * m_plane}, input.options());
  float* vp = floats(V);
  float* mp = floats(M);
  // The transforms' scratch rows (see winograd_impl.h).
  const int64_t input_scratch = m == 4 ? 12 * (4 * TW + 8) + 4 * (TW + 1) : 8 * (TW + 2) + W;
  const int64_t output_scratch = m * m * TW;

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
      std::vector<float> scratch(input_scratch);
      for_images([&](int64_t b, int64_t ty0, int64_t ty1, int64_t t0) {
        v.input(xp + b * C * H * W, c0, c1, H, W, ty0, ty1, vp, v_plane, ld, t0, scratch.data());
      });
    });
    for (int64_t k = 0; k < v.planes; ++k) {
      auto mk = M.as_strided({O, n}, {ld, 1}, k * m_plane);
      at::mm_out(mk, U.as_strided({O, C}, {C, 1}, k * u_plane),
                 V.as_strided({C, n}, {ld, 1}, k * v_plane));
    }
    at::parallel_for(0, O, 1, [&](int64_t o0, int64_t o1) {
      std::vector<float> scratch(output_scratch);
      for_images([&](int64_t b, int64_t ty0, int64_t ty1, int64_t t0) {
        v.output(mp, o0, o1, m_plane, ld, t0, bp, H, W, ty0, ty1, yp + b * O * H * W,
                 scratch.data());
      });
    });
  }
  return y;
}

}  // namespace diffuse::nn
