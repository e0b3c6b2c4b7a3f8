#include "accel/token_merging_payoff.h"

#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <map>

#include "accel/token_merging.h"
#include "diffuse/errors.h"
#include "io/string_affixes.h"
#include "nn/transformer_2d.h"

namespace diffuse::accel {
namespace {

double clock_s() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

// How many times the UNet has halved the latent before the transformer at `site` runs: down
// block i after i downsamplers, up block i (deepest first) after levels - 1 - i, the middle
// block at the bottom.
int site_level(const std::string& site, const models::UNet2DConditionConfig& config) {
  const int levels = static_cast<int>(config.block_out_channels.size());
  auto index_after = [&](const std::string& prefix) {
    return std::stoi(site.substr(prefix.size(), site.find('.', prefix.size()) - prefix.size()));
  };
  if (io::starts_with(site, "down_blocks.")) return index_after("down_blocks.");
  if (io::starts_with(site, "up_blocks.")) return levels - 1 - index_after("up_blocks.");
  return levels - 1;
}

nn::Transformer2DModelImpl& site_module(models::UNet2DConditionModelImpl& unet,
                                        const std::string& site) {
  for (const auto& item : unet.named_modules())
    if (item.key() == site)
      if (auto* t = dynamic_cast<nn::Transformer2DModelImpl*>(item.value().get())) return *t;
  throw InvalidArgument("token merging site '" + site + "' is not a transformer of this UNet");
}

// Reads one value back, so that a device's queued work is finished when the clock is read.
void wait_for(const torch::Tensor& t) {
  t.flatten()[0].item<float>();
}

}  // namespace

TokenMergingPayoff measure_token_merging(models::UNet2DConditionModelImpl& unet,
                                         const models::UNet2DConditionConfig& config,
                                         const std::set<std::string>& sites, int64_t batch,
                                         int64_t latent_height, int64_t latent_width, double ratio,
                                         const torch::TensorOptions& options) {
  torch::NoGradGuard no_grad;
  TokenMergingPayoff payoff;
  // Sites at the same grid and width cost the same: each distinct one is timed once.
  struct Shape {
    nn::BasicTransformerBlockImpl* block;
    int64_t height, width, blocks;
  };
  std::map<std::tuple<int64_t, int64_t, int64_t>, Shape> shapes;
  for (const auto& site : sites) {
    auto& t = site_module(unet, site);
    int64_t h = latent_height, w = latent_width;
    for (int l = site_level(site, config); l > 0; --l) h = (h + 1) / 2, w = (w + 1) / 2;
    auto& s = shapes[{h, w, t.inner_dim}];
    if (!s.block) s = {t.blocks.front().get(), h, w, 0};
    s.blocks += static_cast<int64_t>(t.blocks.size());
  }
  auto gen = at::detail::createCPUGenerator(0);
  for (const auto& [key, s] : shapes) {
    auto& block = *s.block;
    const int64_t tokens = s.height * s.width;
    payoff.tokens = std::max(payoff.tokens, tokens);
    const auto x = torch::randn({batch, tokens, block.options.dim}, gen).to(options);
    torch::Tensor context;
    if (block.options.only_cross_attention)
      context = torch::randn({batch, 77, block.options.cross_attention_dim}, gen).to(options);
    TokenMerging tome(ratio, {"site"}, 0);
    auto plain = [&] { wait_for(block.attn1(block.norm1(x), context, x)); };
    auto merged = [&] {
      const auto plan = tome.plan("site", 0, x, s.height, s.width);
      wait_for(plan->unmerge(block.attn1(plan->merge(block.norm1(x)), context)) + x);
    };
    plain();
    merged();
    double best_plain = 1e300, best_merged = 1e300;
    for (int r = 0; r < 3; ++r) {
      double t0 = clock_s();
      plain();
      best_plain = std::min(best_plain, clock_s() - t0);
      t0 = clock_s();
      merged();
      best_merged = std::min(best_merged, clock_s() - t0);
    }
    payoff.plain_s += best_plain * static_cast<double>(s.blocks);
    payoff.merged_s += best_merged * static_cast<double>(s.blocks);
  }
  return payoff;
}

std::string token_merging_skipped_note(const TokenMergingPayoff& payoff, double ratio,
                                       int64_t steps, const std::string& device) {
  char buf[256];
  std::snprintf(buf, sizeof buf, "token merging %.2f left out: on ", ratio);
  std::string note = buf + device;
  std::snprintf(buf, sizeof buf,
                " at %lld tokens its self-attentions measured %.2fx as fast merged (%.1f ms "
                "against %.1f ms plain)",
                static_cast<long long>(payoff.tokens), payoff.speedup(), payoff.merged_s * 1e3,
                payoff.plain_s * 1e3);
  note += buf;
  if (payoff.call_s > 0 && payoff.saved_s() > 0) {
    // Either the call gains too little, or a first run's few steps do not win back the plain
    // call it timed to decide.
    if (payoff.pays(steps, false))
      std::snprintf(buf, sizeof buf,
                    ", which makes a whole UNet call (%.2f s) %.3fx as fast: over %lld steps too "
                    "little to win back the plain call timed to decide",
                    payoff.call_s, payoff.call_speedup(), static_cast<long long>(steps));
    else
      std::snprintf(buf, sizeof buf, ", which makes a whole UNet call (%.2f s) only %.3fx as fast",
                    payoff.call_s, payoff.call_speedup());
    note += buf;
  }
  return note +
         ", so it would not make the run faster; the tome policy \"always\" applies it anyway";
}

}  // namespace diffuse::accel
