#include "io/pillow_resample.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "diffuse/errors.h"

namespace diffuse::io {
namespace {

constexpr int kResamplePrecisionBits = 32 - 8 - 2;

double lanczos_sinc(double x) {
  if (x == 0.0) return 1.0;
  x *= M_PI;
  return std::sin(x) / x;
}

double lanczos(double x) {
  return (-3.0 <= x && x < 3.0) ? lanczos_sinc(x) * lanczos_sinc(x / 3.0) : 0.0;
}

// Pillow's bicubic_filter (a = -0.5).
double bicubic(double x) {
  constexpr double a = -0.5;
  if (x < 0.0) x = -x;
  if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1;
  if (x < 2.0) return (((x - 5) * x + 8) * x - 4) * a;
  return 0.0;
}

double filter_support(PillowFilter f) {
  return f == PillowFilter::kLanczos ? 3.0 : 2.0;
}

double filter_value(PillowFilter f, double x) {
  return f == PillowFilter::kLanczos ? lanczos(x) : bicubic(x);
}

// Per output pixel: the first input pixel, how many follow, and their fixed-point weights.
struct FilterCoefficients {
  int ksize = 0;
  std::vector<int> first, count;
  std::vector<int32_t> weights;  // [out * ksize]
};

FilterCoefficients filter_coefficients(int in_size, int out_size, PillowFilter filter) {
  // Pillow's precompute_coeffs with the whole image as the box (in0 = 0, in1 = in_size).
  const double scale = static_cast<double>(in_size) / out_size;
  const double filterscale = std::max(scale, 1.0);
  const double support = filter_support(filter) * filterscale;
  FilterCoefficients c;
  c.ksize = static_cast<int>(std::ceil(support)) * 2 + 1;
  c.first.resize(out_size);
  c.count.resize(out_size);
  c.weights.assign(static_cast<size_t>(out_size) * c.ksize, 0);
  std::vector<double> k(c.ksize);
  for (int xx = 0; xx < out_size; ++xx) {
    const double center = (xx + 0.5) * scale;
    const double ss = 1.0 / filterscale;
    const int xmin = std::max(static_cast<int>(center - support + 0.5), 0);
    const int xmax = std::min(static_cast<int>(center + support + 0.5), in_size) - xmin;
    double ww = 0.0;
    for (int x = 0; x < xmax; ++x) {
      k[x] = filter_value(filter, (x + xmin - center + 0.5) * ss);
      ww += k[x];
    }
    for (int x = 0; x < xmax; ++x) {
      const double w = ww != 0.0 ? k[x] / ww : k[x];
      // normalize_coeffs_8bpc: rounded half away from zero.
      c.weights[static_cast<size_t>(xx) * c.ksize + x] =
          static_cast<int32_t>(w < 0 ? -0.5 + w * (1 << kResamplePrecisionBits)
                                     : 0.5 + w * (1 << kResamplePrecisionBits));
    }
    c.first[xx] = xmin;
    c.count[xx] = xmax;
  }
  return c;
}

uint8_t resample_clip8(int32_t v) {
  return static_cast<uint8_t>(std::clamp(v >> kResamplePrecisionBits, 0, 255));
}

}  // namespace

torch::Tensor pillow_lanczos_resize(const torch::Tensor& image, int64_t out_h, int64_t out_w) {
  return pillow_resize(image, out_h, out_w, PillowFilter::kLanczos);
}

torch::Tensor pillow_resize(const torch::Tensor& image, int64_t out_h, int64_t out_w,
                            PillowFilter filter) {
  constexpr int64_t kMaxSide = 65536;
  if (!image.defined() || image.scalar_type() != torch::kUInt8 || image.dim() != 3 ||
      image.size(0) < 1 || image.size(1) < 1 || image.size(2) < 1)
    throw InvalidArgument("pillow_resize: expected a uint8 [H, W, C] image, got " +
                          (image.defined() ? c10::str(image.sizes()) : std::string("none")));
  if (out_h < 1 || out_w < 1 || out_h > kMaxSide || out_w > kMaxSide || image.size(0) > kMaxSide ||
      image.size(1) > kMaxSide)
    throw InvalidArgument("pillow_resize: sides must be in 1.." + std::to_string(kMaxSide) +
                          ", got " + std::to_string(image.size(1)) + "x" +
                          std::to_string(image.size(0)) + " -> " + std::to_string(out_w) + "x" +
                          std::to_string(out_h));
  const auto in = image.contiguous();
  const int H = static_cast<int>(in.size(0)), W = static_cast<int>(in.size(1));
  const int C = static_cast<int>(in.size(2));
  const int OH = static_cast<int>(out_h), OW = static_cast<int>(out_w);
  if (OH == H && OW == W) return in.clone();  // Pillow returns a copy

  const auto horiz = filter_coefficients(W, OW, filter);
  auto vert = filter_coefficients(H, OH, filter);
  const uint8_t* src = in.data_ptr<uint8_t>();
  // Horizontal pass over the rows the vertical pass reads (all rows when it does not run).
  const bool need_h = OW != W, need_v = OH != H;
  int row_first = 0, rows = H;
  torch::Tensor tmp = in;
  if (need_h) {
    row_first = need_v ? vert.first[0] : 0;
    rows = need_v ? vert.first[OH - 1] + vert.count[OH - 1] - row_first : H;
    tmp = torch::empty({rows, OW, C}, torch::kUInt8);
    uint8_t* dst = tmp.data_ptr<uint8_t>();
    for (int y = 0; y < rows; ++y) {
      const uint8_t* line = src + static_cast<size_t>(y + row_first) * W * C;
      for (int xx = 0; xx < OW; ++xx) {
        const int32_t* k = &horiz.weights[static_cast<size_t>(xx) * horiz.ksize];
        for (int ch = 0; ch < C; ++ch) {
          int32_t ss = 1 << (kResamplePrecisionBits - 1);
          for (int x = 0; x < horiz.count[xx]; ++x)
            ss += static_cast<int32_t>(line[(x + horiz.first[xx]) * C + ch]) * k[x];
          dst[(static_cast<size_t>(y) * OW + xx) * C + ch] = resample_clip8(ss);
        }
      }
    }
    for (int yy = 0; yy < OH; ++yy) vert.first[yy] -= row_first;
  }
  if (!need_v) return tmp;
  auto out = torch::empty({OH, OW, C}, torch::kUInt8);
  const uint8_t* t = tmp.data_ptr<uint8_t>();
  uint8_t* dst = out.data_ptr<uint8_t>();
  for (int yy = 0; yy < OH; ++yy) {
    const int32_t* k = &vert.weights[static_cast<size_t>(yy) * vert.ksize];
    for (int xx = 0; xx < OW; ++xx)
      for (int ch = 0; ch < C; ++ch) {
        int32_t ss = 1 << (kResamplePrecisionBits - 1);
        for (int y = 0; y < vert.count[yy]; ++y)
          ss += static_cast<int32_t>(
                    t[(static_cast<size_t>(y + vert.first[yy]) * OW + xx) * C + ch]) *
                k[y];
        dst[(static_cast<size_t>(yy) * OW + xx) * C + ch] = resample_clip8(ss);
      }
  }
  return out;
}

}  // namespace diffuse::io
