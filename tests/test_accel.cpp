// UNet accelerators (issue 16): DeepCache and Token Merging. Each changes the result when on,
// is bit-identical when off, runs the whole UNet on exactly the steps its schedule names, and
// refuses bad parameters with an error naming them. Pipeline-level runs use the demo model
// (models/demo, 128x128, fast).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <torch/torch.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "accel/deepcache.h"
#include "accel/token_merging.h"
#include "accel/token_merging_payoff.h"
#include "accel/unet_accelerator.h"
#include "cli_run.h"
#include "diffuse/pipeline.h"
#include "io/json_config.h"
#include "io/model_folder.h"
#include "models/builtin_configs.h"
#include "models/unet2d_condition.h"
#include "pipeline/stable_diffusion.h"
#include "pipeline_test_util.h"
#include "server/requests.h"
#include "test_util.h"

namespace diffuse {
namespace test_accel {

const std::string kDemo = std::string(DIFFUSE_SOURCE_DIR) + "/models/demo";

using test::fp32_cpu;

GenerationConfig demo_config(uint64_t seed = 3, int steps = 8) {
  GenerationConfig cfg;
  cfg.prompts = {"a red circle on the left and a yellow square on the right on a blue background"};
  cfg.steps = steps;
  cfg.seed = seed;
  return cfg;
}

// Shared by the pipeline tests: loading takes longer than a run.
Text2Image& demo_pipe() {
  static Text2Image pipe = Text2Image::load(kDemo, fp32_cpu());
  return pipe;
}

// The iterations whose UNet call was a full one, from the pipeline's trace.
std::vector<int> traced_full_steps(Text2Image& pipe, const GenerationConfig& cfg,
                                   const Image* init = nullptr) {
  std::vector<int> full;
  int traced = 0;
  pipe.impl()->set_trace([&](const std::string& name, const torch::Tensor& t) {
    const std::string suffix = ".deepcache_full";
    if (name.size() > suffix.size() &&
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0) {
      if (t.item<bool>()) full.push_back(std::stoi(name.substr(5)));
      ++traced;
    }
  });
  if (init)
    Image2Image::sharing(pipe).generate(cfg, *init);
  else
    pipe.generate(cfg);
  pipe.impl()->set_trace({});
  EXPECT_GT(traced, 0);
  return full;
}

bool same(const GenerationResult& a, const GenerationResult& b) {
  return torch::equal(a.latents, b.latents) && a.images[0].rgb == b.images[0].rgb;
}

models::UNet2DConditionModel load_unet_fp32(const std::string& folder) {
  return models::load_unet(io::ModelFolder::open(folder), torch::kCPU, torch::kFloat32);
}

// --- DeepCache -----------------------------------------------------------------------------

TEST(DeepCache, UniformScheduleRunsEveryNthStep) {
  DeepCacheOptions o;
  o.interval = 3;
  auto full = accel::deep_cache_full_steps(o, 10);
  std::vector<int> at;
  for (size_t i = 0; i < full.size(); ++i)
    if (full[i]) at.push_back(static_cast<int>(i));
  EXPECT_EQ(at, (std::vector<int>{0, 3, 6, 9}));
  o.interval = 1;
  for (bool f : accel::deep_cache_full_steps(o, 7)) EXPECT_TRUE(f);
}

TEST(DeepCache, NonUniformScheduleIsDenserEarlyWithTheSameCount) {
  for (int interval : {2, 3, 5})
    for (int steps : {4, 10, 20, 50}) {
      DeepCacheOptions o;
      o.interval = interval;
      o.non_uniform = true;
      auto full = accel::deep_cache_full_steps(o, steps);
      std::vector<int> at;
      for (size_t i = 0; i < full.size(); ++i)
        if (full[i]) at.push_back(static_cast<int>(i));
      ASSERT_EQ(static_cast<int>(at.size()), (steps + interval - 1) / interval)
          << interval << " " << steps;
      EXPECT_EQ(at[0], 0);
      if (at.size() >= 3) {
        EXPECT_LE(at[1] - at[0], at.back() - at[at.size() - 2]);
      }
    }
}

// For every (layer, block) of a UNet: the full path equals forward() bit for bit, and a
// shallow step on the same input, reusing that step's deep feature, gives the same result
// again (the shallow branch recomputes exactly what the full step computed there), while a
// shallow step at another timestep differs. This pins down where the branch re-enters.
void check_every_cache_position(const std::string& folder, int64_t size) {
  auto unet = load_unet_fp32(folder);
  torch::InferenceMode guard;
  const auto& c = unet->config();
  auto gen = at::detail::createCPUGenerator(11);
  auto x = torch::randn({2, c.in_channels, size, size}, gen, torch::kFloat32);
  auto ctx = torch::randn({2, 7, c.cross_attention_dim[0]}, gen, torch::kFloat32);
  auto t = torch::tensor(500.0), t2 = torch::tensor(300.0);
  const auto reference = unet->forward(x, t, ctx);
  int positions = 0;
  for (int64_t layer = 0; layer < static_cast<int64_t>(unet->down_list.size()); ++layer)
    for (int64_t block = 0;
         block < static_cast<int64_t>(unet->down_list[static_cast<size_t>(layer)]->num_outputs());
         ++block) {
      models::UNetDeepCache cache;
      cache.layer_id = layer;
      cache.block_id = block;
      EXPECT_TRUE(torch::equal(unet->forward_deep_cache(x, t, ctx, true, cache), reference))
          << layer << ":" << block;
      ASSERT_TRUE(cache.feature.defined());
      EXPECT_TRUE(
          torch::allclose(unet->forward_deep_cache(x, t, ctx, false, cache), reference, 1e-5, 1e-6))
          << layer << ":" << block;
      EXPECT_FALSE(torch::allclose(unet->forward_deep_cache(x, t2, ctx, false, cache),
                                   unet->forward(x, t2, ctx), 1e-5, 1e-6))
          << layer << ":" << block;
      ++positions;
    }
  EXPECT_GE(positions, 3);
}

TEST(DeepCache, ShallowBranchReentersWhereItsSkipIsConsumedDemoUNet) {
  check_every_cache_position(kDemo, 16);
}

TEST(DeepCache, ShallowBranchReentersWhereItsSkipIsConsumedGoldenUNet) {
  check_every_cache_position(test::golden_model_dir(), 16);
}

TEST(DeepCache, ShallowStepWithoutAFullOneIsRefused) {
  auto unet = load_unet_fp32(kDemo);
  torch::InferenceMode guard;
  models::UNetDeepCache cache;
  auto x = torch::zeros({1, 4, 16, 16});
  auto ctx = torch::zeros({1, 7, unet->config().cross_attention_dim[0]});
  auto msg = test::expect_throw<InvalidArgument>(
      [&] { unet->forward_deep_cache(x, torch::tensor(1.0), ctx, false, cache); });
  EXPECT_NE(msg.find("full step"), std::string::npos) << msg;
}

TEST(DeepCache, OffIsBitIdenticalAndOnChangesTheImage) {
  auto& pipe = demo_pipe();
  const auto base = pipe.generate(demo_config());
  auto cfg = demo_config();
  cfg.deep_cache.interval = 1;
  cfg.deep_cache.layer_id = 1;  // ignored when off
  EXPECT_TRUE(same(pipe.generate(cfg), base));
  cfg.deep_cache.interval = 3;
  cfg.deep_cache.layer_id = 0;
  const auto cached = pipe.generate(cfg);
  EXPECT_FALSE(torch::equal(cached.latents, base.latents));
  // Close to the full computation all the same (a trained model, neighbouring steps).
  const double diff = (cached.images_float - base.images_float).abs().mean().item<double>();
  EXPECT_LT(diff, 0.1) << diff;
  // Same settings, same seed: the same image.
  EXPECT_TRUE(same(pipe.generate(cfg), cached));
}

TEST(DeepCache, RunsTheWholeUNetOnExactlyTheScheduledSteps) {
  auto& pipe = demo_pipe();
  auto cfg = demo_config(1, 10);
  cfg.deep_cache.interval = 3;
  EXPECT_EQ(traced_full_steps(pipe, cfg), (std::vector<int>{0, 3, 6, 9}));
  cfg.deep_cache.interval = 5;
  EXPECT_EQ(traced_full_steps(pipe, cfg), (std::vector<int>{0, 5}));
  cfg.deep_cache.non_uniform = true;
  cfg.deep_cache.interval = 3;
  auto full = traced_full_steps(pipe, cfg);
  EXPECT_EQ(full.size(), 4u);
  EXPECT_EQ(full[0], 0);
}

TEST(DeepCache, WorksWithAMultistepSchedulerAndWithoutGuidance) {
  auto& pipe = demo_pipe();
  for (double guidance : {7.5, 1.0}) {
    auto cfg = demo_config(2, 9);
    cfg.scheduler = "dpmpp_2m";
    cfg.guidance_scale = guidance;
    const auto base = pipe.generate(cfg);
    cfg.deep_cache.interval = 2;
    EXPECT_EQ(traced_full_steps(pipe, cfg), (std::vector<int>{0, 2, 4, 6, 8}));
    const auto cached = pipe.generate(cfg);
    EXPECT_FALSE(torch::equal(cached.latents, base.latents));
    EXPECT_TRUE(torch::isfinite(cached.latents).all().item<bool>());
    EXPECT_LT((cached.images_float - base.images_float).abs().mean().item<double>(), 0.1);
  }
}

TEST(DeepCache, WorksWithImageToImage) {
  auto& pipe = demo_pipe();
  const auto init = pipe.generate(demo_config(5)).images[0];
  auto i2i = Image2Image::sharing(pipe);
  auto cfg = demo_config(6, 10);
  cfg.strength = 0.6;  // 6 of the 10 steps run
  const auto base = i2i.generate(cfg, init);
  cfg.deep_cache.interval = 3;
  EXPECT_EQ(traced_full_steps(pipe, cfg, &init), (std::vector<int>{0, 3}));
  const auto cached = i2i.generate(cfg, init);
  EXPECT_FALSE(torch::equal(cached.latents, base.latents));
  EXPECT_LT((cached.images_float - base.images_float).abs().mean().item<double>(), 0.1);
}

// --- Token merging ---------------------------------------------------------------------------

TEST(TokenMerging, RatioZeroIsTheIdentity) {
  auto gen = at::detail::createCPUGenerator(1);
  auto x = torch::randn({2, 64, 8});
  auto m = accel::match_tokens(x, 8, 8, 0.0, gen);
  EXPECT_EQ(m.merged_count(), 0);
  EXPECT_TRUE(torch::equal(accel::merge_tokens(m, x), x));
  EXPECT_TRUE(torch::equal(accel::unmerge_tokens(m, x), x));
}

TEST(TokenMerging, ShapesAndWhatUnmergeGivesBack) {
  auto gen = at::detail::createCPUGenerator(2);
  const int64_t B = 2, H = 8, W = 6, N = H * W, C = 5;
  auto x = torch::randn({B, N, C});
  auto m = accel::match_tokens(x, H, W, 0.5, gen);
  EXPECT_EQ(m.dst_pos.size(0), (H / 2) * (W / 2));  // one destination per 2x2 cell
  EXPECT_EQ(m.src_pos.size(0) + m.dst_pos.size(0), N);
  EXPECT_EQ(m.merged_count(), N / 2);
  auto merged = accel::merge_tokens(m, x);
  EXPECT_EQ(merged.sizes(), (std::vector<int64_t>{B, N - N / 2, C}));
  auto back = accel::unmerge_tokens(m, merged);
  EXPECT_EQ(back.sizes(), x.sizes());
  // Each destination cell holds exactly one destination.
  std::set<int64_t> cells;
  for (int64_t i = 0; i < m.dst_pos.size(0); ++i) {
    const int64_t p = m.dst_pos[i].item<int64_t>();
    cells.insert((p / W / 2) * (W / 2) + (p % W) / 2);
  }
  EXPECT_EQ(static_cast<int64_t>(cells.size()), m.dst_pos.size(0));
  for (int64_t b = 0; b < B; ++b) {
    // Kept sources come back unchanged.
    auto kept = m.src_pos.index_select(0, m.unmerged[b]);
    EXPECT_TRUE(torch::equal(back[b].index_select(0, kept), x[b].index_select(0, kept)));
    // A merged source copies its destination's value, which is the mean of the destination
    // and everything merged into it.
    for (int64_t k = 0; k < m.merged_count(); ++k) {
      const int64_t src = m.src_pos[m.merged[b][k]].item<int64_t>();
      const int64_t d = m.dst_pos[m.merged_into[b][k]].item<int64_t>();
      EXPECT_TRUE(torch::equal(back[b][src], back[b][d]));
    }
    // Destinations nothing joined keep their value.
    auto joined = torch::zeros({m.dst_pos.size(0)}, torch::kBool);
    joined.index_fill_(0, m.merged_into[b], true);
    auto alone = m.dst_pos.masked_select(joined.logical_not());
    EXPECT_TRUE(torch::allclose(back[b].index_select(0, alone), x[b].index_select(0, alone)));
  }
}

TEST(TokenMerging, IdenticalTokensInACellMergeAndUnmergeLossless) {
  // Every 2x2 cell holds one random vector: each source's best destination is its own cell's,
  // averaging equal vectors changes nothing, and unmerge gives x back.
  auto gen = at::detail::createCPUGenerator(3);
  auto cells = torch::randn({1, 4, 4, 16});
  auto x = cells.repeat_interleave(2, 1).repeat_interleave(2, 2).reshape({1, 64, 16});
  auto m = accel::match_tokens(x, 8, 8, 0.7, gen);
  EXPECT_EQ(m.merged_count(), 44);
  EXPECT_TRUE(torch::allclose(accel::unmerge_tokens(m, accel::merge_tokens(m, x)), x, 1e-5, 1e-6));
}

TEST(TokenMerging, DestinationsFollowTheGenerator) {
  auto x = torch::randn({1, 256, 4});
  auto g1 = at::detail::createCPUGenerator(9), g2 = at::detail::createCPUGenerator(9),
       g3 = at::detail::createCPUGenerator(10);
  auto a = accel::match_tokens(x, 16, 16, 0.5, g1), b = accel::match_tokens(x, 16, 16, 0.5, g2),
       c = accel::match_tokens(x, 16, 16, 0.5, g3);
  EXPECT_TRUE(torch::equal(a.dst_pos, b.dst_pos));
  EXPECT_TRUE(torch::equal(a.merged, b.merged));
  EXPECT_FALSE(torch::equal(a.dst_pos, c.dst_pos));
}

TEST(TokenMerging, DefaultLayersAreTheHighestResolutionSelfAttentions) {
  const auto& sd = models::builtin_arch("sd2.1-base");
  auto cfg = models::UNet2DConditionConfig::from_json(io::JsonConfig(sd.unet, "sd2.1-base"));
  EXPECT_EQ(accel::token_merging_sites({}, cfg),
            (std::set<std::string>{"down_blocks.0.attentions.0", "down_blocks.0.attentions.1",
                                   "up_blocks.3.attentions.1", "up_blocks.3.attentions.2"}));
  // The demo UNet's top level has no attention: its first/last levels with attention.
  auto demo =
      models::UNet2DConditionConfig::from_json(io::JsonConfig::load(kDemo + "/unet/config.json"));
  EXPECT_EQ(accel::token_merging_sites({}, demo),
            (std::set<std::string>{"down_blocks.1.attentions.0", "up_blocks.1.attentions.0",
                                   "up_blocks.1.attentions.1"}));
  TokenMergingOptions o;
  o.ratio = 0.5;
  o.layers = {"mid_block.attentions.0"};
  EXPECT_EQ(accel::token_merging_sites(o, demo), (std::set<std::string>{"mid_block.attentions.0"}));
}

TEST(TokenMerging, OffIsBitIdenticalOnChangesTheImageAndTheSeedRepeatsIt) {
  auto& pipe = demo_pipe();
  const auto base = pipe.generate(demo_config());
  auto cfg = demo_config();
  cfg.token_merging.ratio = 0;
  EXPECT_TRUE(same(pipe.generate(cfg), base));
  cfg.token_merging.ratio = 0.5;
  cfg.token_merging.always = true;  // merged whatever it measures (the policy's own test below)
  const auto merged = pipe.generate(cfg);
  EXPECT_FALSE(torch::equal(merged.latents, base.latents));
  // Half the tokens of an 8x8 grid is a coarse approximation (SD merges on 64x64): near, not
  // close.
  EXPECT_LT((merged.images_float - base.images_float).abs().mean().item<double>(), 0.2);
  EXPECT_TRUE(same(pipe.generate(cfg), merged));
  auto other = cfg;
  other.seed = 4;
  EXPECT_FALSE(torch::equal(pipe.generate(other).latents, merged.latents));
  // Both accelerators together, with img2img.
  cfg.deep_cache.interval = 2;
  const auto both = pipe.generate(cfg);
  EXPECT_FALSE(torch::equal(both.latents, merged.latents));
  EXPECT_TRUE(same(pipe.generate(cfg), both));
  cfg.strength = 0.5;
  const auto i2i = Image2Image::sharing(pipe).generate(cfg, base.images[0]);
  EXPECT_TRUE(torch::isfinite(i2i.latents).all().item<bool>());
}

// --- Parameter validation ------------------------------------------------------------------

TEST(Accel, BadParametersAreRefusedNamingThem) {
  auto& pipe = demo_pipe();
  auto expect_error = [&](const GenerationConfig& cfg, std::vector<std::string> words) {
    auto msg = test::expect_throw<InvalidArgument>([&] { pipe.generate(cfg); });
    for (const auto& w : words) EXPECT_NE(msg.find(w), std::string::npos) << w << " in: " << msg;
  };
  auto cfg = demo_config();
  cfg.deep_cache.interval = 0;
  expect_error(cfg, {"cache_interval", "got 0", ">= 1"});
  cfg = demo_config();
  cfg.deep_cache.interval = 3;
  cfg.deep_cache.layer_id = 3;  // the demo UNet has 3 down blocks
  expect_error(cfg, {"cache_layer_id", "got 3", "0..2"});
  cfg.deep_cache.layer_id = 0;
  cfg.deep_cache.block_id = 2;  // one resnet and the downsampler: 0..1
  expect_error(cfg, {"cache_block_id", "got 2", "0..1", "down_blocks.0"});
  cfg.deep_cache.layer_id = 2;
  cfg.deep_cache.block_id = 1;  // the last block has no downsampler
  expect_error(cfg, {"cache_block_id", "0..0"});
  cfg = demo_config();
  for (double r : {1.0, 1.5, -0.1}) {
    cfg.token_merging.ratio = r;
    expect_error(cfg, {"tome", "[0, 1)"});
  }
  cfg.token_merging.ratio = 0.3;
  cfg.token_merging.layers = {"down_blocks.9.attentions.0"};
  expect_error(cfg, {"down_blocks.9.attentions.0", "not a transformer"});
  // The generation config check alone (what the CLI and the server run before loading).
  GenerationConfig g = demo_config();
  g.token_merging.ratio = 1;
  EXPECT_THROW(pipeline::validate_generation_config(g, false), InvalidArgument);
}

// --graph replays one recorded whole-UNet call: refused with DeepCache and token merging, and
// on a device that cannot record graphs (the CPU), saying so; a refused generation leaves the
// pipeline generating as before.
TEST(Accel, CudaGraphIsRefusedWhereItCannotReplay) {
  auto& pipe = demo_pipe();
  auto expect_error = [&](const GenerationConfig& cfg, std::vector<std::string> words) {
    auto msg = test::expect_throw<InvalidArgument>([&] { pipe.generate(cfg); });
    for (const auto& w : words) EXPECT_NE(msg.find(w), std::string::npos) << w << " in: " << msg;
  };
  auto cfg = demo_config();
  cfg.cuda_graph = true;
  cfg.deep_cache.interval = 2;
  expect_error(cfg, {"--graph", "DeepCache"});
  cfg.deep_cache.interval = 1;
  cfg.token_merging.ratio = 0.3;
  expect_error(cfg, {"--graph", "token merging"});
  cfg.token_merging.ratio = 0;
  expect_error(cfg, {"--graph", "CUDA device", "this runs on cpu"});
  const auto plain = pipe.generate(demo_config());
  EXPECT_TRUE(torch::equal(plain.latents, pipe.generate(demo_config()).latents));
}

// The policy judges what the sites save against whole UNet calls, counting the plain call a
// first run throws away when it then merges.
TEST(TokenMerging, PaysOnlyWhenTheWholeRunIsFasterByTheMargin) {
  accel::TokenMergingPayoff p;
  p.plain_s = 0.2;
  p.merged_s = 0.1;  // the sites twice as fast
  EXPECT_FALSE(p.pays(20, false)) << "no call time measured yet";
  p.call_s = 1.0;  // they save 10 % of a call
  EXPECT_NEAR(p.call_speedup(), 1 / 0.9, 1e-12);
  EXPECT_TRUE(p.pays(20, false));
  EXPECT_TRUE(p.pays(20, true));  // 19 calls' time against 20 plain
  EXPECT_FALSE(p.pays(4, true));  // 4.6 against 4: the thrown-away call is not won back
  EXPECT_TRUE(p.pays(4, false));
  p.call_s = 5.0;  // 2 % of a call: within the margin, left out however many steps
  EXPECT_FALSE(p.pays(1000, false));
  p.call_s = 1.0;
  p.merged_s = 0.3;  // the sites slower
  EXPECT_FALSE(p.pays(1000, false));
  EXPECT_NEAR(p.speedup(), 2.0 / 3, 1e-12);
  p.tokens = 4096;
  auto note = accel::token_merging_skipped_note(p, 0.5, 20, "cpu");
  for (const char* word : {"token merging 0.50 left out", "4096 tokens", "cpu", "0.67x", "always"})
    EXPECT_NE(note.find(word), std::string::npos) << note;
  p.merged_s = 0.19;
  note = accel::token_merging_skipped_note(p, 0.5, 20, "cpu");
  for (const char* word : {"1.05x as fast merged", "whole UNet call (1.00 s) only 1.010x"})
    EXPECT_NE(note.find(word), std::string::npos) << note;
  p.merged_s = 0.1;  // 1.11x a call, but 3 steps do not win back the call timed to decide
  note = accel::token_merging_skipped_note(p, 0.5, 3, "cpu");
  for (const char* word : {"1.111x as fast: over 3 steps", "win back"})
    EXPECT_NE(note.find(word), std::string::npos) << note;
}

// The measurement runs on the UNet's own sites at the run's grid: the demo's sites sit one
// level down, so their grid is the latent's halved (read from the config, as the policy does).
TEST(TokenMerging, PayoffIsMeasuredAtTheSitesGrid) {
  auto unet = load_unet_fp32(kDemo);
  const auto cfg =
      models::UNet2DConditionConfig::from_json(io::JsonConfig::load(kDemo + "/unet/config.json"));
  TokenMergingOptions o;
  o.ratio = 0.5;
  const auto sites = accel::token_merging_sites(o, cfg);
  const int64_t latent = cfg.sample_size.at(0);
  const auto payoff = accel::measure_token_merging(*unet, cfg, sites, 2, latent, latent, 0.5,
                                                   torch::TensorOptions(torch::kFloat32));
  const int64_t grid = (latent + 1) / 2;  // down_blocks.1 / up_blocks.1: one level down
  EXPECT_EQ(payoff.tokens, grid * grid);
  EXPECT_GT(payoff.plain_s, 0);
  EXPECT_GT(payoff.merged_s, 0);
}

// Auto (the default): whatever the timing decided on this machine, the run is exactly one of
// the two and says which: merged (the "always" image, no note), or left out (the plain image,
// with the note).
TEST(TokenMerging, AutoPolicyRunIsEitherTheMergedOrThePlainImageAndSaysWhich) {
  auto& pipe = demo_pipe();
  const auto plain = pipe.generate(demo_config());
  auto cfg = demo_config();
  cfg.token_merging.ratio = 0.5;
  cfg.token_merging.always = true;
  const auto merged = pipe.generate(cfg);
  ASSERT_FALSE(same(merged, plain));
  cfg.token_merging.always = false;
  const auto automatic = pipe.generate(cfg);
  const auto noted = std::count_if(
      automatic.warnings.begin(), automatic.warnings.end(),
      [](const std::string& w) { return w.find("token merging 0.50 left out") == 0; });
  if (noted) {
    EXPECT_TRUE(same(automatic, plain));
  } else {
    EXPECT_TRUE(same(automatic, merged));
  }
  // The model keeps the measurements for this size: a second run does not throw a call away,
  // so it merges at least where the first did.
  const auto again = pipe.generate(cfg);
  const bool again_noted =
      std::any_of(again.warnings.begin(), again.warnings.end(),
                  [](const std::string& w) { return w.find("token merging 0.50 left out") == 0; });
  EXPECT_TRUE(same(again, again_noted ? plain : merged));
  if (!noted) {
    EXPECT_FALSE(again_noted);
  }
}

TEST(Accel, NativeJobApiFields) {
  server::ModelDefaults model;
  server::ServerLimits limits;
  auto job = server::parse_native_job(nlohmann::json{{"prompt", "x"},
                                                     {"deepcache", 3},
                                                     {"deepcache_layer", 1},
                                                     {"deepcache_block", 0},
                                                     {"deepcache_schedule", "non-uniform"},
                                                     {"tome", 0.5},
                                                     {"tome_policy", "always"}},
                                      model, limits);
  EXPECT_TRUE(job.config.token_merging.always);
  EXPECT_EQ(job.config.deep_cache.interval, 3);
  EXPECT_EQ(job.config.deep_cache.layer_id, 1);
  EXPECT_TRUE(job.config.deep_cache.non_uniform);
  EXPECT_EQ(job.config.token_merging.ratio, 0.5);
  auto plain = server::parse_native_job(nlohmann::json{{"prompt", "x"}}, model, limits);
  EXPECT_EQ(plain.config.deep_cache.interval, 1);
  EXPECT_EQ(plain.config.token_merging.ratio, 0);
  EXPECT_FALSE(plain.config.token_merging.always);
  for (const auto& bad : {nlohmann::json{{"prompt", "x"}, {"tome", 1.0}},
                          nlohmann::json{{"prompt", "x"}, {"tome_policy", "sometimes"}},
                          nlohmann::json{{"prompt", "x"}, {"deepcache", 0}},
                          nlohmann::json{{"prompt", "x"}, {"deepcache_schedule", "sometimes"}}})
    EXPECT_THROW(server::parse_native_job(bad, model, limits), InvalidArgument) << bad.dump();
  model.unet_accelerators = false;
  auto msg = test::expect_throw<InvalidArgument>([&] {
    server::parse_native_job(nlohmann::json{{"prompt", "x"}, {"tome", 0.3}}, model, limits);
  });
  EXPECT_NE(msg.find("tome"), std::string::npos) << msg;
}

// --- Through the CLI ---------------------------------------------------------------------------

using test::run_cli;

TEST(AccelCli, DeepCacheAndTomeFlagsMakeImagesAndBadValuesAreOneLineErrors) {
  test::TempDir dir;
  const std::vector<std::string> base = {"txt2img", "-m",     kDemo,    "-p", "a red circle",
                                         "--steps", "4",      "--seed", "1",  "--device",
                                         "cpu",     "--quiet"};
  auto with = [&](std::vector<std::string> extra, const std::string& out) {
    auto args = base;
    args.insert(args.end(), extra.begin(), extra.end());
    args.push_back("-o");
    args.push_back(dir.file(out));
    return run_cli(args, dir);
  };
  auto r = with({"--deepcache", "3"}, "dc.png");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(std::filesystem::exists(dir.file("dc.png")));
  r = with({"--tome", "0.5", "--deepcache", "2:0:1", "--deepcache-schedule", "non-uniform"},
           "both.png");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(std::filesystem::exists(dir.file("both.png")));
  for (const auto& [flags, word] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"--tome", "1.5"}, "--tome"},
           {{"--tome", "0.5", "--tome-policy", "never"}, "--tome-policy"},
           {{"--deepcache", "0"}, "--deepcache"},
           {{"--deepcache", "3:7:0"}, "cache_layer_id"}}) {
    r = with(flags, "bad.png");
    EXPECT_NE(r.exit_code, 0) << flags[1];
    EXPECT_NE(r.err.find(word), std::string::npos) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_FALSE(std::filesystem::exists(dir.file("bad.png")));
  }
}

}  // namespace test_accel
}  // namespace diffuse
