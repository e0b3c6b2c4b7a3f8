#include "bench/parallel_bench.h"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>

#include "diffuse/errors.h"
#include "io/json_config.h"
#include "models/builtin_configs.h"
#include "models/hidream_transformer.h"
#include "nn/layers.h"
#include "nn/random_init.h"
#include "parallel/rank_group.h"

namespace diffuse::bench {

ParallelBenchRank run_parallel_bench_rank(const ParallelBenchOptions& o,
                                          parallel::RankGroup* group) {
  if (o.side < 2 || o.side % 2 != 0 || o.batch < 1 || o.calls < 1 || o.dual_blocks < 0 ||
      o.single_blocks < 0 || o.dual_blocks + o.single_blocks < 1)
    throw InvalidArgument(
        "bench parallel: --side must be an even number >= 2, --batch and --calls >= 1, and "
        "at least one block");
  auto cfg = models::hidream_i1_transformer_config();
  cfg["num_layers"] = o.dual_blocks;
  cfg["num_single_layers"] = o.single_blocks;
  const auto layers = cfg["llama_layers"].get<std::vector<int64_t>>();
  cfg["llama_layers"] = std::vector<int64_t>(
      layers.begin(),
      layers.begin() + std::min<size_t>(layers.size(), o.dual_blocks + o.single_blocks));
  const auto config =
      models::HiDreamTransformerConfig::from_json(io::JsonConfig(cfg, "hidream-i1"));
  torch::NoGradGuard no_grad;
  models::HiDreamImageTransformer2DModel model{nullptr};
  {
    nn::SkipInitGuard skip(torch::kFloat32);
    model = models::HiDreamImageTransformer2DModel(config);
  }
  nn::init_pooled_random_weights(*model, o.seed);
  model->eval();

  // HiDream's text: 128 T5 tokens and 128 Llama tokens of the listed layers.
  const int64_t B = o.batch, text = 128;
  torch::manual_seed(static_cast<int64_t>(o.seed));
  auto x = torch::randn({B, config.in_channels, o.side, o.side});
  auto t = torch::full({B}, 500.0f);
  auto t5 = torch::randn({B, text, config.caption_channels[0]});
  const int64_t llama_layers =
      *std::max_element(config.llama_layers.begin(), config.llama_layers.end()) + 1;
  auto llama = torch::randn({llama_layers, B, text, config.caption_channels[1]});
  auto pooled = torch::randn({B, config.text_emb_dim});
  models::HiDreamForwardOptions fwd;
  fwd.sequence_group = group;

  ParallelBenchRank r;
  r.ranks = group ? group->size() : 1;
  r.image_tokens = (o.side / 2) * (o.side / 2);
  // Each block attends over T5's and the last Llama layer's tokens plus its own Llama layer's.
  r.text_tokens = static_cast<int>(3 * text);
  int64_t params = 0;
  for (const auto& p : model->parameters()) params += p.numel();
  r.params_m = static_cast<double>(params) / 1e6;
  model->forward(x, t, t5, llama, pooled, fwd);  // warm-up
  const int64_t sent_before = group ? group->bytes_sent() : 0;
  double total = 0;
  r.best_s = 1e30;
  for (int i = 0; i < o.calls; ++i) {
    const auto start = std::chrono::steady_clock::now();
    model->forward(x, t, t5, llama, pooled, fwd);
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    total += s;
    r.best_s = std::min(r.best_s, s);
  }
  r.mean_s = total / o.calls;
  if (group) r.bytes_sent_per_call = (group->bytes_sent() - sent_before) / o.calls;
  return r;
}

nlohmann::json to_json(const ParallelBenchRank& r) {
  return {{"ranks", r.ranks},
          {"image_tokens", r.image_tokens},
          {"text_tokens", r.text_tokens},
          {"best_s", r.best_s},
          {"mean_s", r.mean_s},
          {"bytes_sent_per_call", r.bytes_sent_per_call},
          {"params_m", r.params_m}};
}

ParallelBenchRank parallel_bench_rank_from_json(const nlohmann::json& j) {
  ParallelBenchRank r;
  r.ranks = j.at("ranks").get<int>();
  r.image_tokens = j.at("image_tokens").get<int>();
  r.text_tokens = j.at("text_tokens").get<int>();
  r.best_s = j.at("best_s").get<double>();
  r.mean_s = j.at("mean_s").get<double>();
  r.bytes_sent_per_call = j.at("bytes_sent_per_call").get<int64_t>();
  r.params_m = j.at("params_m").get<double>();
  return r;
}

}  // namespace diffuse::bench
