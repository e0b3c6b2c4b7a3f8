#include "bench/gemm_bench.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>

#include "bench/bench_util.h"
#include "device/cpu_info.h"
#include "device/cpu_threads.h"
#include "io/json_config.h"
#include "models/builtin_configs.h"
#include "models/clip_text_model.h"
#include "nn/cpu_bf16_linear.h"
#include "nn/random_init.h"

namespace diffuse::bench {
namespace {

struct Shape {
  const char* model;
  const char* layer;
  int64_t m, n, k;
};

// Rows: tokens x prompts as the pipelines run them (CLIP: 77 x 2 for CFG; T5 and Llama in
// HiDream: 128 x 2; FLUX's T5: 512 x 1); the UNet rows show where oneDNN takes over.
std::vector<Shape> shapes(int batch) {
  const int64_t clip = 77 * batch, dit_text = 128 * batch;
  return {
      {"CLIP-L text", "q/k/v/out_proj", clip, 768, 768},
      {"CLIP-L text", "mlp.fc1", clip, 3072, 768},
      {"CLIP-L text", "mlp.fc2", clip, 768, 3072},
      {"OpenCLIP-H text", "q/k/v/out_proj", clip, 1024, 1024},
      {"OpenCLIP-H text", "mlp.fc1", clip, 4096, 1024},
      {"OpenCLIP-H text", "mlp.fc2", clip, 1024, 4096},
      {"CLIP-G text", "q/k/v/out_proj", clip, 1280, 1280},
      {"CLIP-G text", "mlp.fc1", clip, 5120, 1280},
      {"T5-XXL", "SelfAttention.q", dit_text, 4096, 4096},
      {"T5-XXL", "DenseReluDense.wi_0", dit_text, 10240, 4096},
      {"T5-XXL (FLUX, 512 tokens)", "DenseReluDense.wo", 512, 4096, 10240},
      {"Llama-3.1-8B", "self_attn.k_proj", dit_text, 1024, 4096},
      {"Llama-3.1-8B", "mlp.gate_proj", dit_text, 14336, 4096},
      {"SD2.1 UNet 512px", "attn2.to_out (16x16 level)", 512, 1280, 1280},
      {"SD2.1 UNet 512px", "ff.net.0.proj (32x32 level)", 2048, 5120, 640},
      {"SD2.1 UNet 512px", "ff.net.2 (64x64 level)", 8192, 320, 1280},
  };
}

// Restores the policy the process had when the bench leaves (also by an exception).
struct PolicyRestore {
  nn::Bf16GemmPolicy saved = nn::bf16_gemm_policy();
  ~PolicyRestore() { nn::set_bf16_gemm_policy(saved); }
};

}  // namespace

GemmBenchResult run_gemm_bench(const GemmBenchOptions& o) {
  GemmBenchResult r;
  r.cpu = device::cpu_info().model;
  // The engine's thread policy (every available CPU unless the user chose), as a generation
  // runs; LibTorch's own default may be one thread per physical core.
  device::configure_cpu_threads();
  r.threads = at::get_num_threads();
  PolicyRestore restore;
  nn::set_bf16_gemm_policy(nn::Bf16GemmPolicy::own);
  if (!nn::own_bf16_gemm_applies(1)) {
    r.why_not = "this CPU (or build) has no AVX512-BF16: every bf16 product runs in oneDNN";
    return r;
  }
  r.available = true;
  torch::NoGradGuard no_grad;
  auto gen = at::detail::createCPUGenerator(1234);
  for (const auto& s : shapes(o.batch)) {
    GemmBenchRow row{s.model, s.layer, s.m, s.n, s.k};
    const auto f32 = torch::TensorOptions().dtype(torch::kFloat32);
    const auto x = torch::randn({s.m, s.k}, gen, f32).to(torch::kBFloat16);
    const auto w =
        (torch::randn({s.n, s.k}, gen, f32) / std::sqrt(double(s.k))).to(torch::kBFloat16);
    const auto b = torch::randn({s.n}, gen, f32).to(torch::kBFloat16);
    torch::Tensor own, ref;
    nn::set_bf16_gemm_policy(nn::Bf16GemmPolicy::own);
    row.own_s = best_time([&] { own = nn::cpu_bf16_linear(x, w, b); }, o.min_seconds, 3, 1 << 30);
    row.onednn_s =
        best_time([&] { ref = torch::nn::functional::linear(x, w, b); }, o.min_seconds, 3, 1 << 30);
    const double gflop = 2e-9 * double(s.m) * double(s.n) * double(s.k);
    row.own_gflops = gflop / row.own_s;
    row.onednn_gflops = gflop / row.onednn_s;
    // Each result is a float32 sum rounded to bf16: they may differ by a bf16 step of the
    // larger one, plus the two sums' float32 errors (K * 2^-24 * sum |x||w|).
    const auto x32 = x.to(torch::kFloat32), w32 = w.to(torch::kFloat32);
    const auto abs_sum = torch::mm(x32.abs(), w32.abs().t()) + b.to(torch::kFloat32).abs();
    const auto o32 = own.to(torch::kFloat32), r32 = ref.to(torch::kFloat32);
    const auto bound = torch::maximum(o32.abs(), r32.abs()) * std::ldexp(1.0, -8) +
                       abs_sum * (double(s.k) * std::ldexp(1.0, -24)) + 1e-30;
    row.diff_in_rounding = ((o32 - r32).abs() / bound).max().item<double>();
    nn::set_bf16_gemm_policy(nn::Bf16GemmPolicy::automatic);
    row.auto_takes_own = nn::own_bf16_gemm_applies(s.m);
    if (o.log)
      o.log(std::string(s.model) + " " + s.layer + ": " + fmt("%.1f", row.own_gflops) + " vs " +
            fmt("%.1f GFLOP/s", row.onednn_gflops));
    r.rows.push_back(row);
  }

  // A whole text encoder, random weights at the architecture's config.
  const auto& arch = models::builtin_arch(o.arch);
  const auto cfg = models::ClipTextConfig::from_json(
      io::JsonConfig(arch.text_encoder, "built-in " + arch.name + " text_encoder config"));
  models::ClipTextModel text(cfg);
  nn::init_random_weights(*text, 7);
  text->to(torch::kBFloat16);
  text->eval();
  r.text_model = o.arch + " text_encoder";
  r.text_tokens = static_cast<int>(cfg.max_position_embeddings);
  const auto ids = torch::randint(0, cfg.vocab_size, {o.batch, cfg.max_position_embeddings}, gen,
                                  torch::TensorOptions().dtype(torch::kInt64));
  torch::Tensor own, ref;
  nn::set_bf16_gemm_policy(nn::Bf16GemmPolicy::own);
  r.text_own_s =
      best_time([&] { own = text->forward(ids).last_hidden_state; }, 3 * o.min_seconds, 3, 1 << 30);
  nn::set_bf16_gemm_policy(nn::Bf16GemmPolicy::onednn);
  r.text_onednn_s =
      best_time([&] { ref = text->forward(ids).last_hidden_state; }, 3 * o.min_seconds, 3, 1 << 30);
  r.text_max_abs_diff =
      (own.to(torch::kFloat32) - ref.to(torch::kFloat32)).abs().max().item<double>();
  r.text_max_abs = ref.to(torch::kFloat32).abs().max().item<double>();
  return r;
}

}  // namespace diffuse::bench
