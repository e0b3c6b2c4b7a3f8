#include <gtest/gtest.h>
#include <torch/torch.h>
#include <chrono>
#include "nn/attention.h"
#include "nn/attention/flash.h"
using namespace diffuse;
static double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
TEST(ZZTmp2, Timing) {
  torch::NoGradGuard ng;
  for (auto dt : {torch::kFloat32, torch::kBFloat16}) {
    for (int64_t N : {1024, 4096}) {
      int64_t H = N == 4096 ? 5 : 10;
      auto q = torch::randn({2, N, H, 64}).to(dt).transpose(1,2), k = torch::randn({2, N, H, 64}).to(dt).transpose(1,2), v = torch::randn({2, N, H, 64}).to(dt).transpose(1,2);
      double flops = 4.0 * 2 * H * N * N * 64;
      nn::AttentionOptions o; o.backend = nn::AttentionBackend::kMath;
      nn::attention(q,k,v,o); double t = now(); nn::attention(q,k,v,o); double tm = now() - t;
      printf("%s N=%ld H=%ld math %.3fs %.1f GF/s\n", dt == torch::kFloat32 ? "fp32" : "bf16", N, H, tm, flops/tm/1e9);
      for (auto& kn : nn::flash_kernel_names(dt)) { if (getenv("ZZK") && kn != getenv("ZZK")) continue;
        nn::flash_attention_with_kernel(kn, q,k,v); t = now(); nn::flash_attention_with_kernel(kn,q,k,v); double tf = now() - t;
        printf("   flash %-12s %.3fs %.1f GF/s\n", kn.c_str(), tf, flops/tf/1e9);
      }
    }
  }
}
