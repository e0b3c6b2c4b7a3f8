// The `flash` backend: validates the inputs, picks the best flash kernel this CPU can run
// (flash_kernel.h), packs K and V per (batch, head) and runs query blocks in parallel with
// at::parallel_for. Extra memory: the packed K/V (the size of k and v) plus a small scratch
// per thread; the Nq x Nk score matrix never exists.
#include "nn/attention/flash.h"

#include <ATen/Parallel.h>
#include <torch/torch.h>

#include <cstdlib>
#include <memory>

#include "diffuse/errors.h"
#include "nn/attention/backends.h"
#include "nn/attention/flash_kernel.h"
#include "nn/kernels/cpu_features.h"

namespace diffuse::nn {
namespace {

// Kernels compiled in and runnable on this CPU, best first.
const std::vector<const flash::Kernel*>& runnable_kernels() {
  static const std::vector<const flash::Kernel*> kernels = [] {
    const auto& f = kernels::cpu_features();
    std::vector<const flash::Kernel*> out;
    if (f.avx512_bf16 && flash::avx512_bf16_kernel()) out.push_back(flash::avx512_bf16_kernel());
    if (f.avx512 && flash::avx512_kernel()) out.push_back(flash::avx512_kernel());
    if (f.avx2_fma && flash::avx2_kernel()) out.push_back(flash::avx2_kernel());
    out.push_back(flash::portable_kernel());
    return out;
  }();
  return kernels;
}

bool is_bf16_only(const flash::Kernel* k) {
  return k == flash::avx512_bf16_kernel();
}

const flash::Kernel* find_kernel(const std::string& name) {
  for (const auto* k : runnable_kernels())
    if (name == k->name) return k;
  std::string list;
  for (const auto* k : runnable_kernels())
    list += (list.empty() ? "" : ", ") + std::string(k->name);
  throw InvalidArgument("flash kernel '" + name +
                        "' is not available on this CPU (available: " + list + ")");
}

// DIFFUSE_FLASH_KERNEL forces a kernel (for tests and comparisons); otherwise the best one.
const flash::Kernel* pick_kernel(bool bf16) {
  static const std::string forced = [] {
    const char* env = std::getenv("DIFFUSE_FLASH_KERNEL");
    return std::string(env ? env : "");
  }();
  if (!forced.empty() && forced != "auto") {
    const flash::Kernel* k = find_kernel(forced);
    if (!bf16 && is_bf16_only(k)) return runnable_kernels()[1];
    return k;
  }
  for (const auto* k : runnable_kernels())
    if (bf16 || !is_bf16_only(k)) return k;
  return flash::portable_kernel();
}

void fill_strides(int64_t* dst, const torch::Tensor& t) {
  dst[0] = t.stride(0);
  dst[1] = t.stride(1);
  dst[2] = t.stride(2);
}

uint8_t* align64(uint8_t* p) {
  return reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(p) + 63) & ~uintptr_t{63});
}

torch::Tensor run_kernel(const flash::Kernel* kernel, const torch::Tensor& q_in,
                         const torch::Tensor& k_in, const torch::Tensor& v_in,
                         const AttentionCall& call) {
  // The kernels need only the head dimension contiguous; token/head/batch strides are free,
  // so the [B, N, H, D] -> [B, H, N, D] views of the model code are read in place.
  auto last_contiguous = [](const torch::Tensor& t) {
    return t.stride(3) == 1 ? t : t.contiguous();
  };
  const auto q = last_contiguous(q_in), k = last_contiguous(k_in), v = last_contiguous(v_in);
  const int64_t B = q.size(0), H = q.size(1), Nq = q.size(2), D = q.size(3), Nk = k.size(2);
  // Output as [B, Nq, H, D] memory viewed as [B, H, Nq, D]: the model's transpose(1, 2) +
  // reshape back to [B, Nq, H * D] is then free.
  auto out = torch::empty({B, Nq, H, D}, q.options()).transpose(1, 2);
  if (Nq == 0 || B == 0 || H == 0) return out;

  flash::Problem p;
  p.batch = B;
  p.heads = H;
  p.nq = Nq;
  p.nk = Nk;
  p.head_dim = D;
  p.q = q.data_ptr();
  p.k = k.data_ptr();
  p.v = v.data_ptr();
  p.out = out.data_ptr();
  fill_strides(p.q_stride, q);
  fill_strides(p.k_stride, k);
  fill_strides(p.v_stride, v);
  fill_strides(p.out_stride, out);
  p.bf16 = q.scalar_type() == torch::kBFloat16;
  p.scale = static_cast<float>(call.scale);
  p.causal = call.causal;

  const int64_t per_head = (kernel->packed_bytes(p) + 63) / 64 * 64;
  auto packed = torch::empty({B * H * per_head + 64}, torch::TensorOptions().dtype(torch::kUInt8));
  uint8_t* base = align64(packed.data_ptr<uint8_t>());
  at::parallel_for(0, B * H, 1, [&](int64_t begin, int64_t end) {
    for (int64_t bh = begin; bh < end; ++bh) kernel->pack(p, bh / H, bh % H, base + bh * per_head);
  });

  const int64_t blocks = (Nq + kernel->block_rows - 1) / kernel->block_rows;
  const int64_t scratch_bytes = kernel->scratch_bytes(p);
  at::parallel_for(0, B * H * blocks, 1, [&](int64_t begin, int64_t end) {
    std::unique_ptr<uint8_t[]> buffer(new uint8_t[scratch_bytes + 64]);
    uint8_t* scratch = align64(buffer.get());
    for (int64_t task = begin; task < end; ++task) {
      const int64_t bh = task / blocks, block = task % blocks;
      const int64_t row_begin = block * kernel->block_rows;
      const int64_t row_end = std::min(Nq, row_begin + kernel->block_rows);
      kernel->attend(p, bh / H, bh % H, row_begin, row_end, base + bh * per_head, scratch);
    }
  });
  return out;
}

}  // namespace

std::string flash_unavailable(const torch::Device& device) {
  if (!device.is_cpu()) return "the flash kernels run on the CPU only";
  return "";
}

std::string flash_unsupported(const torch::Tensor& q, const torch::Tensor& k,
                              const torch::Tensor& v, const AttentionCall& call) {
  if (!q.device().is_cpu()) return "tensors are not on the CPU";
  const auto t = q.scalar_type();
  if (t != torch::kFloat32 && t != torch::kBFloat16)
    return std::string("dtype ") + c10::toString(t) + " (flash takes float32 or bfloat16)";
  if (k.scalar_type() != t || v.scalar_type() != t) return "q, k and v have different dtypes";
  if (v.size(3) != q.size(3)) return "v's head dim differs from q's";
  if (k.size(2) == 0) return "no keys";
  if (!(call.scale > 0)) return "a scale that is not positive";
  if (call.bias.defined()) return "an additive bias (the kernel has none)";
  return "";
}

torch::Tensor flash_attention(const torch::Tensor& q, const torch::Tensor& k,
                              const torch::Tensor& v, const AttentionCall& call) {
  return run_kernel(pick_kernel(q.scalar_type() == torch::kBFloat16), q, k, v, call);
}

std::vector<std::string> flash_kernel_names(torch::Dtype dtype) {
  std::vector<std::string> out;
  for (const auto* k : runnable_kernels())
    if (dtype == torch::kBFloat16 || !is_bf16_only(k)) out.emplace_back(k->name);
  return out;
}

std::string flash_kernel_name(torch::Dtype dtype) {
  return pick_kernel(dtype == torch::kBFloat16)->name;
}

torch::Tensor flash_attention_with_kernel(const std::string& kernel, const torch::Tensor& q,
                                          const torch::Tensor& k, const torch::Tensor& v,
                                          const AttentionOptions& options) {
  check_attention_inputs(q, k, v);
  AttentionCall call;
  call.scale = options.scale.value_or(1.0 / std::sqrt(static_cast<double>(q.size(3))));
  call.causal = options.causal;
  call.upcast = options.upcast;
  call.bias = options.bias;
  std::string why = flash_unsupported(q, k, v, call);
  if (!why.empty()) throw InvalidArgument("flash attention cannot run these inputs: " + why);
  const flash::Kernel* kern = find_kernel(kernel);
  if (is_bf16_only(kern) && q.scalar_type() != torch::kBFloat16)
    throw InvalidArgument("flash kernel '" + kernel + "' takes bfloat16 inputs only");
  return run_kernel(kern, q, k, v, call);
}

}  // namespace diffuse::nn
