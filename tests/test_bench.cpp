// The benchmark's measuring instruments: the FLOP counter (against hand counts and an
// independent count from the UNet config), the built-in architectures, and `diffuse bench
// --json` on the tiny architecture.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "bench/bench_util.h"
#include "bench/dit_block_bench.h"
#include "bench/flop_counter.h"
#include "bench/op_profile.h"
#include "bench/page_cache.h"
#include "bench/precision_bench.h"
#include "bench/text_encoder_bench.h"
#include "cli_run.h"
#include "cpu_bf16.h"
#include "device/cpu_load.h"
#include "diffuse/errors.h"
#include "io/json_config.h"
#include "models/builtin_configs.h"
#include "models/hidream_transformer.h"
#include "models/llama.h"
#include "models/t5_encoder.h"
#include "models/unet2d_condition.h"
#include "nn/attention.h"
#include "nn/layers.h"
#include "nn/random_init.h"
#include "nn/winograd_conv.h"
#include "pipeline/step_work.h"
#include "test_util.h"
#include "verify/golden.h"

using namespace diffuse;

namespace test_bench {

// FLOPs of one UNet2DConditionModel forward written out from diffusers' structure (2 per
// multiply-add; convolutions, linear layers and attention products only), independently of
// the engine's module code.
struct HandCount {
  double conv = 0, matmul = 0, attention = 0;
  double total() const { return conv + matmul + attention; }
};

HandCount unet_flops_by_hand(const models::UNet2DConditionConfig& c, double B, double h, double w,
                             double T) {
  HandCount f;
  auto conv = [&](double ci, double co, double k, double hw) {
    f.conv += 2 * B * hw * co * ci * k * k;
  };
  auto lin = [&](double in, double out, double rows) { f.matmul += 2 * rows * in * out; };
  const double temb = static_cast<double>(c.time_embedding_dim);
  const bool scale_shift = c.resnet_time_scale_shift == "scale_shift";
  auto resnet = [&](double ci, double co, double hw) {
    conv(ci, co, 3, hw);
    lin(temb, scale_shift ? 2 * co : co, B);
    conv(co, co, 3, hw);
    if (ci != co) conv(ci, co, 1, hw);
  };
  auto transformer = [&](double ch, double hw, int64_t layers, double cross, bool only_cross) {
    const double BN = B * hw;
    lin(ch, ch, BN);  // proj_in (a 1x1 conv has the same count; SD2 uses linear)
    for (int64_t l = 0; l < layers; ++l) {
      // attn1: self-attention (or over the text when only_cross_attention)
      const double kv_tokens = only_cross ? T : hw, kv_dim = only_cross ? cross : ch;
      lin(ch, ch, BN);
      lin(kv_dim, ch, B * kv_tokens);
      lin(kv_dim, ch, B * kv_tokens);
      f.attention += 4 * B * hw * kv_tokens * ch;
      lin(ch, ch, BN);
      // attn2: cross-attention to the text tokens
      lin(ch, ch, BN);
      lin(cross, ch, B * T);
      lin(cross, ch, B * T);
      f.attention += 4 * B * hw * T * ch;
      lin(ch, ch, BN);
      // GEGLU feed-forward
      lin(ch, 8 * ch, BN);
      lin(4 * ch, ch, BN);
    }
    lin(ch, ch, BN);  // proj_out
  };
  const auto& boc = c.block_out_channels;
  const size_t n = boc.size();
  double hw = h * w;
  conv(static_cast<double>(c.in_channels), static_cast<double>(boc[0]),
       static_cast<double>(c.conv_in_kernel), hw);
  lin(static_cast<double>(boc[0]), temb, B);
  lin(temb, temb, B);
  double ch = static_cast<double>(boc[0]);
  std::vector<double> skips{ch};
  for (size_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < c.layers_per_block[i]; ++j) {
      resnet(ch, static_cast<double>(boc[i]), hw);
      ch = static_cast<double>(boc[i]);
      if (c.down_block_types[i] == "CrossAttnDownBlock2D")
        transformer(ch, hw, c.transformer_layers_per_block[i],
                    static_cast<double>(c.cross_attention_dim[i]), c.only_cross_attention[i]);
      skips.push_back(ch);
    }
    if (i + 1 < n) {
      hw /= 4;
      conv(ch, ch, 3, hw);
      skips.push_back(ch);
    }
  }
  resnet(ch, ch, hw);
  transformer(ch, hw, c.transformer_layers_per_block[n - 1],
              static_cast<double>(c.cross_attention_dim[n - 1]), false);
  resnet(ch, ch, hw);
  for (size_t i = 0; i < n; ++i) {
    const size_t d = n - 1 - i;  // the down block this up block mirrors
    for (int64_t j = 0; j < c.layers_per_block[d] + 1; ++j) {
      const double skip = skips.back();
      skips.pop_back();
      resnet(ch + skip, static_cast<double>(boc[d]), hw);
      ch = static_cast<double>(boc[d]);
      if (c.up_block_types[i] == "CrossAttnUpBlock2D")
        transformer(ch, hw, c.transformer_layers_per_block[d],
                    static_cast<double>(c.cross_attention_dim[d]), c.only_cross_attention[d]);
    }
    if (i + 1 < n) {
      hw *= 4;
      conv(ch, ch, 3, hw);
    }
  }
  conv(static_cast<double>(boc[0]), static_cast<double>(c.out_channels),
       static_cast<double>(c.conv_out_kernel), h * w);
  return f;
}

models::UNet2DConditionConfig arch_unet(const std::string& arch) {
  return models::UNet2DConditionConfig::from_json(
      io::JsonConfig(models::builtin_arch(arch).unet, arch));
}

// Runs the UNet at its sample size under a FlopCounter and compares with the hand count.
void expect_trace_equals_hand_count(const models::UNet2DConditionConfig& cfg,
                                    const std::string& what) {
  torch::InferenceMode guard;
  models::UNet2DConditionModel unet(cfg);
  nn::init_random_weights(*unet, 3);
  const int64_t s = cfg.sample_size.empty() ? 8 : cfg.sample_size[0], B = 2, T = 77;
  auto sample = torch::randn({B, cfg.in_channels, s, s});
  auto ctx = torch::randn({B, T, cfg.cross_attention_dim[0]});
  bench::FlopCounts counts;
  {
    bench::FlopCounter counter;
    unet->forward(sample, torch::tensor(500), ctx);
    counts = counter.counts();
  }
  const auto hand = unet_flops_by_hand(cfg, B, s, s, T);
  EXPECT_GT(hand.total(), 0) << what;
  EXPECT_NEAR(counts.conv, hand.conv, 1e-9 * hand.conv) << what;
  EXPECT_NEAR(counts.matmul, hand.matmul, 1e-9 * hand.matmul) << what;
  EXPECT_NEAR(counts.attention, hand.attention, 1e-9 * hand.attention) << what;
}

std::string run_command(const std::string& cmd, int* status) {
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  *status = pclose(p);
  return out;
}

TEST(FlopCounter, CountsConvLinearAndAttentionOnce) {
  torch::InferenceMode guard;
  bench::FlopCounts c;
  {
    bench::FlopCounter counter;
    torch::conv2d(torch::randn({2, 3, 8, 8}), torch::randn({4, 3, 3, 3}), torch::Tensor(), 1, 1);
    torch::conv2d(torch::randn({1, 4, 9, 9}), torch::randn({2, 4, 3, 3}), torch::Tensor(),
                  /*stride=*/2, /*padding=*/std::vector<int64_t>{0, 0});  // 4x4 out
    torch::linear(torch::randn({2, 5, 7}), torch::randn({3, 7}),
                  torch::randn({3}));  // linear -> matmul inside
    torch::bmm(torch::randn({3, 4, 5}), torch::randn({3, 5, 6}));
    auto q = torch::randn({1, 2, 3, 4}), k = torch::randn({1, 2, 5, 4});
    nn::AttentionOptions o;
    o.backend = nn::AttentionBackend::kMath;  // its bmm calls must not count twice
    nn::attention(q, k, k, o);
    torch::relu(torch::randn({10}));  // not counted
    c = counter.counts();
  }
  EXPECT_DOUBLE_EQ(c.conv, 2.0 * 2 * 4 * 64 * 27 + 2.0 * 1 * 2 * 16 * 36);
  EXPECT_DOUBLE_EQ(c.matmul, 2.0 * 10 * 7 * 3 + 2.0 * 3 * 4 * 5 * 6);
  EXPECT_DOUBLE_EQ(c.attention, 2.0 * 2 * 3 * 5 * (4 + 4));
  EXPECT_DOUBLE_EQ(c.total(), c.conv + c.matmul + c.attention);
  EXPECT_EQ(c.conv_winograd, 0.0);
}

// An nn::Conv2d that takes the Winograd path counts its direct FLOPs once under conv, and the
// same again under conv_winograd (the share of conv that multiplied less).
TEST(FlopCounter, CountsWinogradConvolutionsAsConvAndAsTheirShare) {
  torch::InferenceMode guard;
  torch::manual_seed(3);
  auto conv = nn::make_conv2d(torch::nn::Conv2dOptions(384, 384, 3).padding(1));
  const auto x = torch::randn({2, 384, 16, 16});
  ASSERT_TRUE(nn::winograd_conv_applies(x, conv->weight, {1, 1}, {1, 1}, {1, 1}, 1));
  bench::FlopCounts c;
  {
    bench::FlopCounter counter;
    conv->forward(x);
    c = counter.counts();
  }
  const double direct = 2.0 * 2 * 384 * 256 * 384 * 9;
  EXPECT_DOUBLE_EQ(c.conv, direct);
  EXPECT_DOUBLE_EQ(c.conv_winograd, direct);
  EXPECT_DOUBLE_EQ(c.total(), direct);
  EXPECT_EQ(bench::OpProfile::kind_of("diffuse::conv2d_winograd"), "conv");
}

TEST(OpProfile, FilesOutermostOperatorsByKindOnce) {
  torch::InferenceMode guard;
  auto x = torch::randn({2, 3, 16, 16}), w = torch::randn({4, 3, 3, 3});
  auto a = torch::randn({64, 32}), b = torch::randn({16, 32});
  std::vector<bench::OpTime> kinds, ops;
  double total = 0;
  {
    bench::OpProfile profile;
    for (int i = 0; i < 3; ++i) torch::conv2d(x, w, torch::Tensor(), 1, 1);
    torch::linear(a, b);  // its inner matmul is not counted again
    auto q = torch::randn({1, 2, 8, 4});
    nn::AttentionOptions o;
    o.backend = nn::AttentionBackend::kMath;  // bmm and softmax inside count as attention
    nn::attention(q, q, q, o);
    kinds = profile.by_kind();
    ops = profile.by_operator(100);
    total = profile.total_s();
  }
  auto calls = [&](const std::string& kind) {
    for (const auto& k : kinds)
      if (k.name == kind) return k.calls;
    return int64_t{0};
  };
  EXPECT_EQ(calls("conv"), 3);
  EXPECT_EQ(calls("matmul"), 1);
  EXPECT_EQ(calls("attention"), 1);
  double sum = 0;
  for (const auto& k : kinds) sum += k.seconds;
  EXPECT_NEAR(sum, total, 1e-9);
  for (size_t i = 1; i < ops.size(); ++i) EXPECT_GE(ops[i - 1].seconds, ops[i].seconds);
  EXPECT_EQ(bench::OpProfile::kind_of("diffuse::group_norm"), "norm");
  EXPECT_EQ(bench::OpProfile::kind_of("diffuse::geglu"), "activation");
  EXPECT_EQ(bench::OpProfile::kind_of("aten::cat"), "copy/layout");
  EXPECT_EQ(bench::OpProfile::kind_of("aten::add_"), "elementwise");
  EXPECT_EQ(bench::OpProfile::kind_of("aten::frobnicate"), "other");
  // One profile per thread, as the FLOP counter.
  bench::OpProfile first;
  EXPECT_THROW(bench::OpProfile(), InvalidArgument);
}

TEST(FlopCounter, OnlyOnePerThread) {
  bench::FlopCounter counter;
  EXPECT_THROW(bench::FlopCounter(), InvalidArgument);
}

TEST(FlopCounter, UNetTraceMatchesHandCountOnGoldenConfig) {
  auto cfg = models::UNet2DConditionConfig::from_json(
      io::JsonConfig::load(test::golden_dir() + "/model/unet/config.json"));
  expect_trace_equals_hand_count(cfg, "golden unet");
}

TEST(FlopCounter, UNetTraceMatchesHandCountOnTinyArch) {
  expect_trace_equals_hand_count(arch_unet("tiny"), "tiny arch");
}

TEST(FlopCounter, StableDiffusion21BaseStepIs1608GFlop) {
  // The published figure for SD2.1-base at 512x512 with classifier-free guidance (batch 2).
  const auto hand = unet_flops_by_hand(arch_unet("sd2.1-base"), 2, 64, 64, 77);
  EXPECT_NEAR(hand.total() / 1e9, 1608.5, 0.05);
}

TEST(BenchArch, BuiltInConfigsParse) {
  for (const auto& name : models::builtin_arch_names()) {
    const auto& a = models::builtin_arch(name);
    auto unet = models::UNet2DConditionConfig::from_json(io::JsonConfig(a.unet, name));
    EXPECT_EQ(unet.block_out_channels.size(), name == "sdxl" ? 3u : 4u) << name;
    // The UNet attends to the text encoders' states side by side.
    int64_t width = a.text_encoder.at("hidden_size").get<int64_t>();
    if (!a.text_encoder_2.is_null()) width += a.text_encoder_2.at("hidden_size").get<int64_t>();
    EXPECT_EQ(unet.cross_attention_dim[0], width) << name;
  }
  auto sdxl = arch_unet("sdxl");
  EXPECT_TRUE(sdxl.text_time);
  EXPECT_EQ(sdxl.projection_class_embeddings_input_dim,
            6 * sdxl.addition_time_embed_dim +
                models::builtin_arch("sdxl").text_encoder_2.at("projection_dim").get<int64_t>());
  auto sd21 = arch_unet("sd2.1");
  EXPECT_TRUE(sd21.upcast_attention);
  EXPECT_EQ(sd21.sample_size[0], 96);
  EXPECT_EQ(models::builtin_arch("sd2.1").scheduler.at("prediction_type"), "v_prediction");
  auto sd15 = arch_unet("sd1.5");
  EXPECT_EQ(sd15.num_attention_heads[0], 8);
  EXPECT_FALSE(sd15.use_linear_projection);
  EXPECT_THROW(models::builtin_arch("sdxl-turbo"), InvalidArgument);
}

TEST(BenchArch, HiDreamConfigsParse) {
  auto hidream = models::HiDreamTransformerConfig::from_json(
      io::JsonConfig(models::hidream_i1_transformer_config(), "hidream-i1"));
  EXPECT_EQ(hidream.num_layers + hidream.num_single_layers, 48);
  EXPECT_EQ(hidream.inner_dim(), 2560);
  EXPECT_EQ(hidream.max_seq(), 4096);
  auto t5 = models::T5Config::from_json(
      io::JsonConfig(bench::text_encoder_arch_config("t5-xxl"), "t5-xxl"));
  EXPECT_EQ(t5.d_model, 4096);
  EXPECT_TRUE(t5.is_gated);
  auto llama = models::LlamaConfig::from_json(
      io::JsonConfig(bench::text_encoder_arch_config("llama-3.1-8b"), "llama"));
  EXPECT_EQ(llama.num_key_value_heads, 8);
  EXPECT_EQ(llama.rope_type, "llama3");
  EXPECT_THROW(bench::text_encoder_arch_config("t5-xl"), InvalidArgument);
  // Bad sizes are refused before anything is built.
  bench::DitBlockBenchOptions o;
  o.width = 1000;
  EXPECT_THROW(bench::run_dit_block_bench(o), InvalidArgument);
}

TEST(BenchCli, JsonHasTheStageKeys) {
  int status = -1;
  // One thread: a second one only waits on a busy machine for a model this small. The CPU
  // named: on a machine with a GPU, auto would pick it (and its memory would count).
  std::string out =
      run_command("DIFFUSE_THREADS=1 " + std::string(DIFFUSE_CLI_PATH) +
                      " bench --arch tiny --device cpu --steps 1 --no-roofline --json 2>/dev/null",
                  &status);
  ASSERT_EQ(status, 0) << out;
  auto j = nlohmann::json::parse(out);
  for (const char* key : {"device", "dtype", "attention", "width", "height", "text_encoder_s",
                          "unet_step_s", "vae_decode_s", "peak_rss_mb", "unet_gflop", "vae_gflop",
                          "vae_gflop_by_kind", "device_peak_mb", "device_peak_mb_by_stage"})
    EXPECT_TRUE(j.contains(key)) << key;
  EXPECT_EQ(j["width"], 16);
  EXPECT_GT(j["unet_step_s"].get<double>(), 0);
  EXPECT_GT(j["unet_gflop"].get<double>(), 0);
  EXPECT_GT(j["vae_gflop_by_kind"]["conv"].get<double>(), 0);
  EXPECT_GT(j["peak_rss_mb"].get<double>(), 0);
  EXPECT_EQ(j["device_peak_mb"].get<double>(), 0);  // on the CPU
}

// With two or more timed steps the report gives their range and median (how much a shared
// machine moved during the run); one step has no spread to give.
TEST(BenchCli, TextGivesTheSpreadOfTheTimedSteps) {
  const std::string cli = "DIFFUSE_THREADS=1 " + std::string(DIFFUSE_CLI_PATH) +
                          " bench --arch tiny --device cpu --no-roofline --no-vae "
                          "--no-text-encoder --warmup 0 --steps ";
  int status = -1;
  std::string out = run_command(cli + "3 2>/dev/null", &status);
  ASSERT_EQ(status, 0) << out;
  const auto at = out.find("; steps ");
  ASSERT_NE(at, std::string::npos) << out;
  double lo = 0, hi = 0, mid = 0;
  ASSERT_EQ(std::sscanf(out.c_str() + at, "; steps %lf-%lf s, median %lf", &lo, &hi, &mid), 3)
      << out;
  EXPECT_GT(lo, 0);
  EXPECT_LE(lo, mid);
  EXPECT_LE(mid, hi);
  // And what other processes took from the CPUs meanwhile, where /proc/stat tells.
  if (device::sample_cpu_times()) {
    EXPECT_NE(out.find("; other processes used "), std::string::npos) << out;
  }
  out = run_command(cli + "1 2>/dev/null", &status);
  ASSERT_EQ(status, 0) << out;
  EXPECT_EQ(out.find("; steps "), std::string::npos) << out;
}

TEST(BenchUtil, MedianIsTheUpperMiddle) {
  EXPECT_EQ(bench::median({}), 0);
  EXPECT_EQ(bench::median({3, 1, 2}), 2);
  EXPECT_EQ(bench::median({4, 1}), 4);
}

// --fail-above compares the step with its roofline limit: without the roofline, or on a bench
// without a UNet step, it is an error rather than a silent pass.
TEST(BenchCli, FailAboveNeedsAUNetStepAndTheRoofline) {
  int status = -1;
  std::string out =
      run_command("DIFFUSE_THREADS=1 " + std::string(DIFFUSE_CLI_PATH) +
                      " bench --arch tiny --steps 1 --no-roofline --fail-above 2 2>&1",
                  &status);
  EXPECT_NE(status, 0);
  EXPECT_NE(out.find("--fail-above needs the UNet step and the roofline"), std::string::npos)
      << out;
  out = run_command(std::string(DIFFUSE_CLI_PATH) + " bench --arch hidream-i1 --fail-above 2 2>&1",
                    &status);
  EXPECT_NE(status, 0);
  EXPECT_NE(out.find("--fail-above checks a UNet step"), std::string::npos) << out;
  out = run_command(std::string(DIFFUSE_CLI_PATH) + " bench --arch tiny --fail-above -1 2>&1",
                    &status);
  EXPECT_NE(status, 0);
  EXPECT_NE(out.find("--fail-above"), std::string::npos) << out;
}

// A file just written is in the page cache; a missing one is skipped; a folder's weight files
// are its *.safetensors/*.bin/*.ckpt/*.pt, found in subfolders too.
TEST(PageCache, CountsResidentBytesOfWeightFiles) {
  test::TempDir dir;
  std::filesystem::create_directories(dir.file("unet"));
  {
    std::ofstream f(dir.file("unet/diffusion_pytorch_model.safetensors"), std::ios::binary);
    std::vector<char> bytes(3 * 4096 + 100, 'x');
    f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    std::ofstream(dir.file("unet/config.json")) << "{}";
  }
  const auto files = bench::weight_files(dir.path().string());
  ASSERT_EQ(files.size(), 1u);
  auto state = bench::page_cache_state({files[0], dir.file("missing.safetensors")});
  EXPECT_EQ(state.bytes, 3 * 4096 + 100);
  EXPECT_EQ(state.resident_bytes, state.bytes);
  EXPECT_DOUBLE_EQ(state.fraction(), 1.0);
  EXPECT_EQ(bench::weight_files(files[0]), files);
  EXPECT_EQ(bench::page_cache_state({}).fraction(), 0.0);
}

// --whole-image runs the real pipeline on a model folder and puts it against the limits of the
// same run: N steps, the load timed twice, a positive limit and ratio.
TEST(BenchCli, WholeImageRunsThePipelineAgainstTheStageLimits) {
  test::TempDir dir;
  const std::string model = verify::GoldenSet::load(test::golden_dir()).model_dir();
  auto r = test::run_cli(
      {"bench", "-m", model, "--whole-image", "2", "--steps", "1", "--warmup", "0", "--json"}, dir,
      "DIFFUSE_THREADS=1");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto w = nlohmann::json::parse(r.out).at("whole_image");
  EXPECT_EQ(w["steps"], 2);
  EXPECT_EQ(w["step_s"].size(), 2u);
  EXPECT_EQ(w["scheduler"], "dpmpp_2m");
  EXPECT_GT(w["weights_bytes"].get<double>(), 0);
  EXPECT_GT(w["load_s"].get<double>(), 0);
  EXPECT_GT(w["warm_load_s"].get<double>(), 0);
  EXPECT_GT(w["generate_s"].get<double>(), 0);
  EXPECT_GT(w["limit_s"].get<double>(), 0);
  // The limit's own roofline, measured before the pipeline ran (in the pipeline's dtype).
  EXPECT_GT(w["roofline"]["matmul_gflops"].get<double>(), 0);
  EXPECT_GT(w["roofline"]["conv_gflops"].get<double>(), 0);
  EXPECT_NEAR(w["ratio"].get<double>(), w["generate_s"].get<double>() / w["limit_s"].get<double>(),
              1e-9);
  // Without a model there is no pipeline to run: a clear error, not a silent skip.
  auto bad = test::run_cli({"bench", "--arch", "tiny", "--whole-image", "2"}, dir);
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.err.find("--whole-image runs the real pipeline"), std::string::npos) << bad.err;
}

// Several whole-image runs: the first reported apart, the stage times the median later run's;
// --graph refused before anything is built where there are no device graphs.
TEST(BenchCli, WholeImageRunsReportTheFirstApartAndGraphNeedsCuda) {
  test::TempDir dir;
  const std::string model = verify::GoldenSet::load(test::golden_dir()).model_dir();
  auto r = test::run_cli(
      {"bench", "-m", model, "--whole-image", "2", "--whole-image-runs", "3", "--no-unet",
       "--no-vae", "--no-text-encoder", "--no-roofline", "--device", "cpu", "--json"},
      dir, "DIFFUSE_THREADS=1");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto w = nlohmann::json::parse(r.out).at("whole_image");
  ASSERT_EQ(w["generate_runs_s"].size(), 3u);
  EXPECT_EQ(w["first_generate_s"].get<double>(), w["generate_runs_s"][0].get<double>());
  bool is_a_later_run = false;
  for (size_t i = 1; i < 3; ++i)
    is_a_later_run |= w["generate_s"].get<double>() == w["generate_runs_s"][i].get<double>();
  EXPECT_TRUE(is_a_later_run);
  auto bad = test::run_cli({"bench", "--arch", "tiny", "--graph", "--device", "cpu"}, dir);
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.err.find("--graph: graph replay records accelerator kernels (CUDA graphs, "
                         "torch_npu's NPUGraph); this runs on cpu"),
            std::string::npos)
      << bad.err;
  EXPECT_EQ(bad.err.find("built"), std::string::npos) << "refused only after building: " << bad.err;
}

TEST(BenchCli, RejectsUnknownArch) {
  int status = -1;
  std::string out =
      run_command(std::string(DIFFUSE_CLI_PATH) + " bench --arch nope --no-roofline 2>&1", &status);
  EXPECT_NE(status, 0);
  EXPECT_NE(out.find("unknown architecture 'nope'"), std::string::npos) << out;
}

TEST(BenchPrecision, Bf16PipelineStaysAbove35DbAndFloat32AutoMatchesMath) {
  bench::PrecisionOptions o;
  o.golden = test::golden_dir();
  if (test::cpu_runs_bf16()) {
    o.dtype = "bf16";
    o.vae_dtype = "bf16";
    auto rows = bench::run_precision_bench(o);
    ASSERT_FALSE(rows.empty());
    for (const auto& r : rows) EXPECT_GE(r.psnr_db, 35.0) << r.case_name;
  } else {  // refused with the reason (no oneDNN bf16 kernels on this CPU)
    o.dtype = "bf16";
    EXPECT_THROW(bench::run_precision_bench(o), InvalidArgument);
  }
  o.dtype = "fp32";
  o.vae_dtype = "fp32";
  for (const auto& r : bench::run_precision_bench(o)) {
    EXPECT_GE(r.psnr_db, 90.0) << r.case_name;  // flash vs math in float32: rounding only
    EXPECT_LT(r.max_abs_diff, 1e-4) << r.case_name;
  }
}

// The estimate that picks a generation's CPU threads (pipeline/step_work.h) against the hand
// count, from the config and parameter count alone: a tiny two-level UNet, and SD2.1-base (built
// without its weights' pages being touched) for 128x128 and 512x512 images. Below that SD's
// text projections, which run over the 77 tokens and not the positions, are a third of its work.
TEST(StepWork, UNetEstimateIsWithinAFifthOfTheCountedFlops) {
  for (const std::string arch : {"tiny", "sd2.1-base"}) {
    const auto cfg = arch_unet(arch);
    int64_t params = 0;
    {
      nn::SkipInitGuard skip(torch::kBFloat16);
      models::UNet2DConditionModel unet(cfg);
      for (const auto& p : unet->parameters()) params += p.numel();
    }
    for (int64_t side : {arch == "tiny" ? 8 : 16, 32, 64}) {
      const double counted = unet_flops_by_hand(cfg, 2, side, side, 77).total();
      const double estimate = pipeline::unet_step_flops(cfg, params, 2, side, side);
      EXPECT_NEAR(estimate / counted, 1.0, 0.2) << arch << " at " << side << "x" << side;
    }
  }
}

}  // namespace test_bench
