#include "nn/fused_ops.h"

#include <ATen/Parallel.h>
#include <ATen/record_function.h>
#include <torch/torch.h>
#include <torch/version.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "diffuse/errors.h"
#include "nn/attention.h"
#include "nn/kernels/cpu_features.h"
#include "nn/npu_fused_ops.h"

namespace diffuse::nn {
namespace {

// The fused kernels have no backward: while autograd records (training the demo model), the
// ops take LibTorch's differentiable path instead.
bool grad_wanted(std::initializer_list<torch::Tensor> tensors) {
  if (!torch::GradMode::is_enabled()) return false;
  for (const auto& t : tensors)
    if (t.defined() && t.requires_grad()) return true;
  return false;
}

bool fused_cpu_bf16(const torch::Tensor& x) {
  return x.device().is_cpu() && x.scalar_type() == torch::kBFloat16 && x.is_contiguous();
}

const uint16_t* bf16_data(const torch::Tensor& t) {
  return reinterpret_cast<const uint16_t*>(t.data_ptr());
}
uint16_t* bf16_data_mut(torch::Tensor& t) {
  return reinterpret_cast<uint16_t*>(t.data_ptr());
}

// bf16 channels-last [B, C, H, W] on the CPU (and not also plain contiguous, e.g. 1x1).
bool fused_cpu_bf16_channels_last(const torch::Tensor& x) {
  return x.device().is_cpu() && x.scalar_type() == torch::kBFloat16 && x.dim() == 4 &&
         !x.is_contiguous() && x.is_contiguous(torch::MemoryFormat::ChannelsLast);
}

// float32 copy of an optional per-channel parameter (undefined stays undefined).
torch::Tensor as_float(const torch::Tensor& t) {
  return t.defined() ? t.to(torch::kCPU, torch::kFloat32).contiguous() : t;
}

}  // namespace

namespace {

// GroupNorm of a channels-last bf16 tensor: per-channel shifted sums over pixel chunks (in
// parallel), combined exactly into per-group mean and variance in double, then one
// vectorised pass of per-channel scale and shift (+ SiLU). The output stays channels-last.
torch::Tensor group_norm_channels_last(const torch::Tensor& x, int64_t groups, const float* wp,
                                       const float* bp, double eps, bool silu,
                                       bool overwrite_input) {
  const int64_t B = x.size(0), C = x.size(1), P = x.size(2) * x.size(3), cpg = C / groups;
  // Statistics are complete before the elementwise pass writes, so y may be x itself.
  auto y = overwrite_input ? x : torch::empty_like(x);  // preserves channels-last
  const uint16_t* xp = reinterpret_cast<const uint16_t*>(x.data_ptr());
  uint16_t* yp = reinterpret_cast<uint16_t*>(y.data_ptr());
  const auto& k = kernels::cpu_kernels();
  const int64_t chunks = std::max<int64_t>(1, std::min<int64_t>(P, 4 * at::get_num_threads()));
  std::vector<float> shift(C), scale_c(C), shift_c(C);
  std::vector<double> s1(chunks * C), s2(chunks * C);
  for (int64_t n = 0; n < B; ++n) {
    const uint16_t* xn = xp + n * P * C;
    for (int64_t c = 0; c < C; ++c) {
      uint32_t u = static_cast<uint32_t>(xn[c]) << 16;
      std::memcpy(&shift[c], &u, sizeof(float));
    }
    std::fill(s1.begin(), s1.end(), 0.0);
    std::fill(s2.begin(), s2.end(), 0.0);
    at::parallel_for(0, chunks, 1, [&](int64_t begin, int64_t end) {
      std::vector<float> scratch(2 * C);
      for (int64_t i = begin; i < end; ++i) {
        const int64_t p0 = P * i / chunks, p1 = P * (i + 1) / chunks;
        k.bf16_channel_sums(xn + p0 * C, p1 - p0, C, shift.data(), scratch.data(), &s1[i * C],
                            &s2[i * C]);
      }
    });
    for (int64_t g = 0; g < groups; ++g) {
      // Per channel: mean and sum of squared deviations from the shifted sums; per group:
      // the exact combination (parallel-axis theorem).
      std::vector<double> mean(cpg), m2(cpg);
      double group_mean = 0;
      for (int64_t j = 0; j < cpg; ++j) {
        const int64_t c = g * cpg + j;
        double t1 = 0, t2 = 0;
        for (int64_t i = 0; i < chunks; ++i) {
          t1 += s1[i * C + c];
          t2 += s2[i * C + c];
        }
        mean[j] = shift[c] + t1 / static_cast<double>(P);
        m2[j] = std::max(0.0, t2 - t1 * t1 / static_cast<double>(P));
        group_mean += mean[j];
      }
      group_mean /= static_cast<double>(cpg);
      double group_m2 = 0;
      for (int64_t j = 0; j < cpg; ++j)
        group_m2 += m2[j] + P * (mean[j] - group_mean) * (mean[j] - group_mean);
      const double rstd = 1.0 / std::sqrt(group_m2 / static_cast<double>(P * cpg) + eps);
      for (int64_t j = 0; j < cpg; ++j) {
        const int64_t c = g * cpg + j;
        const double a = rstd * (wp ? wp[c] : 1.0f);
        scale_c[c] = static_cast<float>(a);
        shift_c[c] = static_cast<float>((bp ? bp[c] : 0.0f) - group_mean * a);
      }
    }
    at::parallel_for(0, P, std::max<int64_t>(1, 16384 / C), [&](int64_t begin, int64_t end) {
      k.bf16_channel_scale_shift(xn + begin * C, end - begin, C, scale_c.data(), shift_c.data(),
                                 silu, yp + n * P * C + begin * C);
    });
  }
  return y;
}

}  // namespace

torch::Tensor group_norm(const torch::Tensor& x, int64_t groups, const torch::Tensor& weight,
                         const torch::Tensor& bias, double eps, bool silu, bool overwrite_input) {
  RECORD_FUNCTION("diffuse::group_norm", std::vector<c10::IValue>({x}));
  if (x.dim() < 2 || groups <= 0 || x.size(1) % groups != 0)
    throw InvalidArgument("group_norm: input " + c10::str(x.sizes()) + " cannot be split into " +
                          std::to_string(groups) + " groups");
  const bool grad = grad_wanted({x, weight, bias});
  if (!grad && fused_cpu_bf16_channels_last(x)) {
    auto w = as_float(weight), b = as_float(bias);
    return group_norm_channels_last(x, groups, w.defined() ? w.data_ptr<float>() : nullptr,
                                    b.defined() ? b.data_ptr<float>() : nullptr, eps, silu,
                                    overwrite_input);
  }
  if (grad || !fused_cpu_bf16(x)) {
    const bool upcast = x.device().is_cpu() && x.scalar_type() != torch::kFloat32;
    auto xf = upcast ? x.to(torch::kFloat32) : x;
    auto y = torch::group_norm(xf, groups, upcast ? as_float(weight) : weight,
                               upcast ? as_float(bias) : bias, eps);
    if (silu) y = grad ? torch::silu(y) : torch::silu_(y);
    return upcast ? y.to(x.scalar_type()) : y;
  }
  const int64_t B = x.size(0), C = x.size(1), per_channel = x.numel() / std::max<int64_t>(B * C, 1);
  const int64_t cpg = C / groups;
  auto w = as_float(weight), b = as_float(bias);
  const float* wp = w.defined() ? w.data_ptr<float>() : nullptr;
  const float* bp = b.defined() ? b.data_ptr<float>() : nullptr;
  // Each group's moments are taken before its elements are rewritten: y may be x itself.
  auto y = overwrite_input ? x : torch::empty_like(x);
  const uint16_t* xp = bf16_data(x);
  uint16_t* yp = bf16_data_mut(y);
  const auto& k = kernels::cpu_kernels();
  at::parallel_for(0, B * groups, 1, [&](int64_t begin, int64_t end) {
    for (int64_t task = begin; task < end; ++task) {
      const int64_t n = task / groups, g = task % groups;
      const int64_t offset = (n * C + g * cpg) * per_channel;
      double mean, var;
      k.bf16_moments(xp + offset, cpg * per_channel, &mean, &var);
      const double rstd = 1.0 / std::sqrt(var + eps);
      for (int64_t c = 0; c < cpg; ++c) {
        const int64_t ch = g * cpg + c;
        const double scale = rstd * (wp ? wp[ch] : 1.0f);
        const double shift = (bp ? bp[ch] : 0.0f) - mean * scale;
        k.bf16_scale_shift(xp + offset + c * per_channel, per_channel, static_cast<float>(scale),
                           static_cast<float>(shift), silu, yp + offset + c * per_channel);
      }
    }
  });
  return y;
}

torch::Tensor layer_norm(const torch::Tensor& x, const torch::Tensor& weight,
                         const torch::Tensor& bias, double eps) {
  RECORD_FUNCTION("diffuse::layer_norm", std::vector<c10::IValue>({x}));
  const int64_t D = x.size(-1);
  if (grad_wanted({x, weight, bias}) || !fused_cpu_bf16(x)) {
    const bool upcast = x.device().is_cpu() && x.scalar_type() != torch::kFloat32;
    auto xf = upcast ? x.to(torch::kFloat32) : x;
    auto y = torch::layer_norm(xf, {D}, upcast ? as_float(weight) : weight,
                               upcast ? as_float(bias) : bias, eps);
    return upcast ? y.to(x.scalar_type()) : y;
  }
  auto w = as_float(weight), b = as_float(bias);
  const float* wp = w.defined() ? w.data_ptr<float>() : nullptr;
  const float* bp = b.defined() ? b.data_ptr<float>() : nullptr;
  auto y = torch::empty_like(x);
  const uint16_t* xp = bf16_data(x);
  uint16_t* yp = bf16_data_mut(y);
  const auto& k = kernels::cpu_kernels();
  const int64_t rows = D > 0 ? x.numel() / D : 0;
  at::parallel_for(0, rows, std::max<int64_t>(1, 16384 / std::max<int64_t>(D, 1)),
                   [&](int64_t begin, int64_t end) {
                     for (int64_t r = begin; r < end; ++r)
                       k.bf16_layer_norm_row(xp + r * D, D, wp, bp, static_cast<float>(eps),
                                             yp + r * D);
                   });
  return y;
}

torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps) {
  RECORD_FUNCTION("diffuse::rms_norm", std::vector<c10::IValue>({x}));
  const int64_t D = x.size(-1);
  if (weight.defined() && (weight.dim() != 1 || weight.size(0) != D))
    throw InvalidArgument("rms_norm: weight of shape " + c10::str(weight.sizes()) +
                          " for inputs whose last dimension is " + std::to_string(D));
  if (auto fused = npu_rms_norm(x, weight, eps)) return *fused;
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
  // On CUDA, LibTorch's own (torch.nn.RMSNorm's, which the reference runs): one fused kernel
  // from 2.8 on, where the float32 steps below were eight passes over the tensor (a tenth of a
  // full-size HiDream block's time on an H200).
  if (x.is_cuda())
    return at::rms_norm(
        x, {D}, weight.defined() ? c10::optional<torch::Tensor>(weight) : c10::nullopt, eps);
#endif
  // float32 statistics and scaling, one rounding to x's dtype at the end (torch.nn.RMSNorm in
  // float32; for bf16 it keeps the mean of squares from being summed in bf16).
  const bool upcast = x.scalar_type() != torch::kFloat32 && x.scalar_type() != torch::kFloat64;
  auto xf = upcast ? x.to(torch::kFloat32) : x;
  auto y = xf * torch::rsqrt(xf.pow(2).mean(-1, /*keepdim=*/true) + eps);
  if (weight.defined()) y = y * weight.to(xf.scalar_type());
  return upcast ? y.to(x.scalar_type()) : y;
}

namespace {

// as_float of a bias that must hold one value per each of n features.
torch::Tensor float_vector(const torch::Tensor& t, int64_t n, const char* who) {
  if (t.defined() && t.numel() != n)
    throw InvalidArgument(std::string(who) + ": bias of " + std::to_string(t.numel()) +
                          " values for " + std::to_string(n) + " features");
  return as_float(t);
}

const float* float_data(const torch::Tensor& t) {
  return t.defined() ? t.data_ptr<float>() : nullptr;
}

// Rows of `width` values per parallel task: about 16k values each.
int64_t rows_per_task(int64_t width) {
  return std::max<int64_t>(1, 16384 / std::max<int64_t>(width, 1));
}

}  // namespace

bool fused_bf16_epilogue(std::initializer_list<torch::Tensor> activations,
                         std::initializer_list<torch::Tensor> parameters) {
  if (grad_wanted(activations) || grad_wanted(parameters)) return false;
  for (const auto& t : activations)
    if (!fused_cpu_bf16(t)) return false;
  return true;
}

bool fused_f32_geglu(const torch::Tensor& h, const torch::Tensor& bias) {
  return !grad_wanted({h, bias}) && h.device().is_cpu() && h.scalar_type() == torch::kFloat32 &&
         h.is_contiguous() && default_attention_backend() != AttentionBackend::kMath;
}

torch::Tensor geglu(const torch::Tensor& h, const torch::Tensor& bias) {
  RECORD_FUNCTION("diffuse::geglu", std::vector<c10::IValue>({h}));
  const int64_t F = h.size(-1) / 2;
  if (h.size(-1) % 2 != 0)
    throw InvalidArgument("geglu: last dimension " + std::to_string(h.size(-1)) + " is odd");
  const bool f32 = fused_f32_geglu(h, bias);
  if (!f32 && !fused_bf16_epilogue({h}, {bias})) {
    auto parts = (bias.defined() ? h + bias : h).chunk(2, -1);
    return parts[0] * torch::gelu(parts[1]);
  }
  const auto b = float_vector(bias, 2 * F, "geglu");
  const float* bp = float_data(b);
  auto sizes = h.sizes().vec();
  sizes.back() = F;
  auto y = torch::empty(sizes, h.options());
  const auto& k = kernels::cpu_kernels();
  const int64_t rows = F > 0 ? y.numel() / F : 0;
  auto each_row = [&](const auto* hp, auto* yp, auto kernel) {
    at::parallel_for(0, rows, rows_per_task(F), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r)
        kernel(hp + r * 2 * F, hp + r * 2 * F + F, F, bp, bp ? bp + F : nullptr, yp + r * F);
    });
  };
  if (f32)
    each_row(h.data_ptr<float>(), y.data_ptr<float>(), k.f32_geglu);
  else
    each_row(bf16_data(h), bf16_data_mut(y), k.bf16_geglu);
  return y;
}

void add_bias_residual_(torch::Tensor& h, const torch::Tensor& bias,
                        const torch::Tensor& residual) {
  RECORD_FUNCTION("diffuse::add_bias_residual_", std::vector<c10::IValue>({h}));
  if (!h.sizes().equals(residual.sizes()))
    throw InvalidArgument("add_bias_residual_: residual of shape " + c10::str(residual.sizes()) +
                          " for a product of shape " + c10::str(h.sizes()));
  if (!fused_bf16_epilogue({h, residual}, {bias}))
    throw InvalidArgument("add_bias_residual_: needs contiguous bf16 CPU tensors outside autograd");
  const int64_t N = h.size(-1);
  const auto b = float_vector(bias, N, "add_bias_residual_");
  const float* bp = float_data(b);
  uint16_t* hp = bf16_data_mut(h);
  const uint16_t* rp = bf16_data(residual);
  const auto& k = kernels::cpu_kernels();
  const int64_t rows = N > 0 ? h.numel() / N : 0;
  at::parallel_for(0, rows, rows_per_task(N), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) k.bf16_add_bias_residual(hp + r * N, bp, rp + r * N, N);
  });
}

namespace {

// DIFFUSE_CHANNELS_LAST: 0 = NCHW everywhere; 1 = also channels-last for fp16/bf16 on CUDA
// (cuDNN's tensor-core convolutions are NHWC; NCHW costs them transposes); unset = the
// measured defaults below.
enum class ChannelsLastSetting { kOff, kDefault, kForce };

ChannelsLastSetting channels_last_setting() {
  static const ChannelsLastSetting setting = [] {
    const char* env = std::getenv("DIFFUSE_CHANNELS_LAST");
    if (env && std::string(env) == "0") return ChannelsLastSetting::kOff;
    if (env && std::string(env) == "1") return ChannelsLastSetting::kForce;
    return ChannelsLastSetting::kDefault;
  }();
  return setting;
}

bool channels_last_enabled() {
  return channels_last_setting() != ChannelsLastSetting::kOff;
}

bool channels_last_on_cuda(const torch::Device& device, torch::Dtype dtype) {
  return device.is_cuda() && (dtype == torch::kHalf || dtype == torch::kBFloat16) &&
         channels_last_setting() == ChannelsLastSetting::kForce;
}

}  // namespace

bool channels_last_at(int64_t pixels) {
  constexpr int64_t kMinChannelsLastPixels = 32 * 32;
  return channels_last_enabled() && pixels >= kMinChannelsLastPixels;
}

torch::Tensor to_compute_layout(const torch::Tensor& x, const torch::Tensor& conv_weight) {
  if (x.dim() != 4) return x;
  if (x.device().is_cuda()) {
    const bool weight_channels_last = conv_weight.defined() && conv_weight.dim() == 4 &&
                                      !conv_weight.is_contiguous() &&
                                      conv_weight.is_contiguous(torch::MemoryFormat::ChannelsLast);
    // NCHW weights take NCHW activations even when these come channels-last (a channels-last
    // UNet's latents reaching an NCHW VAE), or cuDNN would follow the activation's layout.
    return x.contiguous(weight_channels_last ? torch::MemoryFormat::ChannelsLast
                                             : torch::MemoryFormat::Contiguous);
  }
  if (!x.device().is_cpu() || x.scalar_type() != torch::kBFloat16 || !channels_last_enabled())
    return x;
  return x.contiguous(channels_last_at(x.size(2) * x.size(3)) ? torch::MemoryFormat::ChannelsLast
                                                              : torch::MemoryFormat::Contiguous);
}

void use_compute_layout(torch::nn::Module& module, bool cuda_channels_last) {
  if (!cuda_channels_last) return;
  torch::NoGradGuard no_grad;
  for (auto& p : module.parameters()) {
    if (p.dim() == 4 && channels_last_on_cuda(p.device(), p.scalar_type()))
      p.set_data(p.contiguous(torch::MemoryFormat::ChannelsLast));
  }
}

torch::Tensor GroupNormImpl::group_norm(const torch::Tensor& x, bool silu, bool overwrite_input) {
  return nn::group_norm(x, options.num_groups(), weight, bias, options.eps(), silu,
                        overwrite_input);
}

RMSNormImpl::RMSNormImpl(int64_t dim, double eps) : eps(eps) {
  weight = register_parameter("weight", torch::ones({dim}));
}

torch::Tensor LayerNormImpl::forward(const torch::Tensor& x) {
  if (options.normalized_shape().size() != 1)
    return torch::nn::LayerNormImpl::forward(x);  // not used by the models; LibTorch's path
  return nn::layer_norm(x, weight, bias, options.eps());
}

}  // namespace diffuse::nn
