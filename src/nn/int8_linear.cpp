#include "nn/int8_linear.h"

#include <ATen/Parallel.h>
#include <torch/torch.h>

#include <algorithm>
#include <string>
#include <vector>

#ifdef DIFFUSE_WITH_DNNL
#include <oneapi/dnnl/dnnl.h>
#endif

#include "diffuse/errors.h"
#include "nn/kernels/cpu_features.h"
#include "nn/kernels/cpu_kernels.h"

namespace diffuse::nn {
namespace {

// Rows per GEMM call: bounds the int32 sums held at once (rows x outputs x 4 bytes, 40 MiB
// for HiDream's 10240-wide feed-forward) while each call still has rows enough to keep the
// GEMM's packed weight panels busy.
constexpr int64_t kRowChunk = 1024;

}  // namespace

bool int8_gemm_available() {
#ifdef DIFFUSE_WITH_DNNL
  return kernels::cpu_features().avx512_vnni;
#else
  return false;
#endif
}

void int8_gemm_offset_codes(const uint8_t* codes, int64_t rows, int64_t k, const int8_t* wq,
                            int64_t n, int32_t* acc) {
#ifdef DIFFUSE_WITH_DNNL
  // The offset turns the unsigned codes back into signed ones.
  const int32_t no_offset = 0;
  const dnnl_status_t status = dnnl_gemm_u8s8s32('N', 'T', 'F', rows, n, k, 1.0f, codes, k, 128, wq,
                                                 k, 0, 0.0f, acc, n, &no_offset);
  if (status != dnnl_success)
    throw Error("oneDNN's integer GEMM failed (status " + std::to_string(static_cast<int>(status)) +
                ") for " + std::to_string(rows) + "x" + std::to_string(k) + " by " +
                std::to_string(n) + "x" + std::to_string(k));
#else
  (void)codes, (void)rows, (void)k, (void)wq, (void)n, (void)acc;
  throw Error("this build has no oneDNN integer GEMM (int8_gemm_available() is false)");
#endif
}

void int8_rows_product(int64_t rows, const quant::QuantizedWeight& w,
                       const std::function<float(int64_t row, uint8_t* codes)>& quantize_row,
                       const torch::Tensor& bias, const torch::Tensor& residual, torch::Tensor& y) {
  const int64_t K = w.cols, N = w.rows;
  const auto scales = w.row_scales.to(torch::kFloat).contiguous();
  const float* sw = scales.data_ptr<float>();
  const float* bp = bias.defined() ? bias.data_ptr<float>() : nullptr;
  const auto* wq = reinterpret_cast<const int8_t*>(w.blocks.data_ptr<uint8_t>());
  const auto& k = kernels::cpu_kernels();
  const bool bf16 = y.scalar_type() == torch::kBFloat16;
  const int64_t chunk = std::min(rows, kRowChunk);
  std::vector<uint8_t> codes(static_cast<size_t>(chunk * K));
  std::vector<float> sx(static_cast<size_t>(chunk));
  std::vector<int32_t> acc(static_cast<size_t>(chunk * N));
  for (int64_t m0 = 0; m0 < rows; m0 += chunk) {
    const int64_t n_rows = std::min(chunk, rows - m0);
    at::parallel_for(0, n_rows, 1, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) sx[i] = quantize_row(m0 + i, codes.data() + i * K);
    });
    int8_gemm_offset_codes(codes.data(), n_rows, K, wq, N, acc.data());
    at::parallel_for(0, n_rows, 1, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        const int32_t* a = acc.data() + i * N;
        const int64_t row = (m0 + i) * N;
        if (bf16) {
          const auto* res =
              residual.defined()
                  ? reinterpret_cast<const uint16_t*>(residual.data_ptr<at::BFloat16>()) + row
                  : nullptr;
          k.bf16_int8_dequantize_row(a, N, sx[i], sw, bp, res,
                                     reinterpret_cast<uint16_t*>(y.data_ptr<at::BFloat16>()) + row);
        } else {
          const float* res = residual.defined() ? residual.data_ptr<float>() + row : nullptr;
          k.f32_int8_dequantize_row(a, N, sx[i], sw, bp, res, y.data_ptr<float>() + row);
        }
      }
    });
  }
}

bool int8_linear_runs(const torch::Tensor& input, const quant::QuantizedWeight& w) {
  return w.type == quant::GgmlType::I8_ROWS && w.blocks.defined() && w.row_scales.defined() &&
         w.blocks.device().is_cpu() && input.device().is_cpu() &&
         (input.scalar_type() == torch::kFloat || input.scalar_type() == torch::kBFloat16) &&
         input.dim() >= 1 && input.size(-1) == w.cols &&
         !(torch::autograd::GradMode::is_enabled() && input.requires_grad()) &&
         int8_gemm_available();
}

bool int8_linear_chosen(const torch::Tensor& input, const quant::QuantizedWeight& w) {
  if (input.scalar_type() == torch::kBFloat16 && kernels::cpu_features().amx_bf16) return false;
  return int8_linear_runs(input, w);
}

torch::Tensor int8_linear(const torch::Tensor& input, const quant::QuantizedWeight& w,
                          const torch::Tensor& bias, const torch::Tensor& residual) {
  if (!int8_linear_runs(input, w))
    throw InvalidArgument(
        "int8_linear: needs an int8-rows weight and a float32/bf16 CPU input of " +
        std::to_string(w.cols) + " features on a CPU with AVX512-VNNI, got " +
        c10::str(input.sizes()) + " " + c10::toString(input.scalar_type()) + " on " +
        input.device().str());
  const int64_t K = w.cols, N = w.rows;
  const auto x = input.reshape({-1, K}).contiguous();
  const int64_t M = x.size(0);
  auto out_sizes = input.sizes().vec();
  out_sizes.back() = N;
  auto y = torch::empty({M, N}, x.options());
  torch::Tensor r;
  if (residual.defined()) {
    if (!residual.sizes().equals(out_sizes) || residual.scalar_type() != x.scalar_type())
      throw InvalidArgument("int8_linear: a residual of " + c10::str(residual.sizes()) + " " +
                            c10::toString(residual.scalar_type()) + " for an output of " +
                            c10::str(c10::IntArrayRef(out_sizes)) + " " +
                            c10::toString(x.scalar_type()));
    r = residual.reshape({M, N}).contiguous();
  }
  if (bias.defined() && bias.numel() != N)
    throw InvalidArgument("int8_linear: a bias of " + std::to_string(bias.numel()) +
                          " values for " + std::to_string(N) + " outputs");
  const auto b = bias.defined() ? bias.to(torch::kFloat).contiguous() : torch::Tensor();
  if (M == 0) return y.view(out_sizes);
  const auto& k = kernels::cpu_kernels();
  if (x.scalar_type() == torch::kBFloat16) {
    const auto* xb = reinterpret_cast<const uint16_t*>(x.data_ptr<at::BFloat16>());
    int8_rows_product(
        M, w, [&](int64_t i, uint8_t* q) { return k.bf16_quantize_row_u8(xb + i * K, K, q); }, b, r,
        y);
  } else {
    const float* xf = x.data_ptr<float>();
    int8_rows_product(
        M, w, [&](int64_t i, uint8_t* q) { return k.f32_quantize_row_u8(xf + i * K, K, q); }, b, r,
        y);
  }
  return y.view(out_sizes);
}

}  // namespace diffuse::nn
