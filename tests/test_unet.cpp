// UNet2DConditionModel: config parsing and its errors, input validation, the conv-projection
// (SD1-style) variant, diffusers' head-count naming, and the bf16 + upcast_attention path.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <set>

#include "diffuse/errors.h"
#include "io/model_folder.h"
#include "io/safetensors.h"
#include "models/unet2d_condition.h"
#include "nn/embeddings.h"
#include "cpu_bf16.h"
#include "test_util.h"
#include "verify/verify.h"

namespace diffuse {
namespace test_unet {

namespace fs = std::filesystem;
using models::UNet2DConditionConfig;
using models::UNet2DConditionModel;

// Two levels, one attention block each way, 4 groups: small enough to build in milliseconds.
nlohmann::json tiny_config() {
  return {{"block_out_channels", {8, 16}},
          {"down_block_types", {"CrossAttnDownBlock2D", "DownBlock2D"}},
          {"up_block_types", {"UpBlock2D", "CrossAttnUpBlock2D"}},
          {"layers_per_block", 1},
          {"attention_head_dim", 2},
          {"norm_num_groups", 4},
          {"cross_attention_dim", 12},
          {"in_channels", 4},
          {"out_channels", 4}};
}

UNet2DConditionConfig parse(const nlohmann::json& j) {
  return UNet2DConditionConfig::from_json(io::JsonConfig(j, "test/unet/config.json"));
}

TEST(UNetConfig, UnknownBlockTypeNamesFileKeyAndValue) {
  auto j = tiny_config();
  j["down_block_types"] = {"CrossAttnDownBlock2D", "SkipDownBlock2D"};
  auto msg = test::expect_throw<ConfigError>([&] { parse(j); });
  EXPECT_NE(msg.find("test/unet/config.json"), std::string::npos) << msg;
  EXPECT_NE(msg.find("down_block_types"), std::string::npos) << msg;
  EXPECT_NE(msg.find("SkipDownBlock2D"), std::string::npos) << msg;

  j = tiny_config();
  j["up_block_types"] = {"UpBlock2D", "AttnUpBlock2D"};
  msg = test::expect_throw<ConfigError>([&] { parse(j); });
  EXPECT_NE(msg.find("AttnUpBlock2D"), std::string::npos) << msg;
}

TEST(UNetConfig, MissingBlockOutChannels) {
  auto j = tiny_config();
  j.erase("block_out_channels");
  auto msg = test::expect_throw<ConfigError>([&] { parse(j); });
  EXPECT_NE(msg.find("block_out_channels"), std::string::npos) << msg;
  EXPECT_NE(msg.find("test/unet/config.json"), std::string::npos) << msg;
}

TEST(UNetConfig, RejectsUnsupportedAndInconsistentSettings) {
  auto j = tiny_config();
  j["num_class_embeds"] = 10;
  EXPECT_NE(test::expect_throw<ConfigError>([&] { parse(j); }).find("num_class_embeds"),
            std::string::npos);
  j = tiny_config();
  j["addition_embed_type"] = "image";  // Kandinsky's; SDXL's text_time is supported
  EXPECT_NE(test::expect_throw<ConfigError>([&] { parse(j); }).find("addition_embed_type"),
            std::string::npos);
  j = tiny_config();
  j["addition_embed_type"] = "text_time";  // without its sizes
  EXPECT_NE(test::expect_throw<ConfigError>([&] { parse(j); }).find("addition_time_embed_dim"),
            std::string::npos);
  j = tiny_config();
  j["layers_per_block"] = {1, 2, 3};  // 3 values for 2 blocks
  EXPECT_NE(test::expect_throw<ConfigError>([&] { parse(j); }).find("layers_per_block"),
            std::string::npos);
  j = tiny_config();
  j["attention_head_dim"] = 3;  // 3 heads cannot split 8 channels
  EXPECT_NE(test::expect_throw<ConfigError>([&] { parse(j); }).find("attention_head_dim"),
            std::string::npos);
  j = tiny_config();
  j["norm_num_groups"] = 3;
  EXPECT_NE(test::expect_throw<ConfigError>([&] { parse(j); }).find("norm_num_groups"),
            std::string::npos);
  j = tiny_config();
  j["act_fn"] = "tanh";
  EXPECT_NE(test::expect_throw<ConfigError>([&] { parse(j); }).find("tanh"), std::string::npos);
  j = tiny_config();
  j["down_block_types"] = {"DownBlock2D"};
  EXPECT_NE(test::expect_throw<ConfigError>([&] { parse(j); }).find("down_block_types"),
            std::string::npos);
}

TEST(UNetConfig, AttentionHeadDimIsTheHeadCountUnlessNumAttentionHeadsIsSet) {
  auto j = tiny_config();
  j["attention_head_dim"] = {2, 4};
  auto c = parse(j);
  EXPECT_EQ(c.num_attention_heads, (std::vector<int64_t>{2, 4}));
  UNet2DConditionModel unet(c);
  auto& attn = unet->down_list[0]->attention_list[0]->blocks[0]->attn1;
  EXPECT_EQ(attn->heads, 2);
  EXPECT_EQ(attn->dim_head, 4);  // 8 channels / 2 heads
  EXPECT_EQ(unet->mid_block->attention_list[0]->blocks[0]->attn2->heads, 4);

  j["num_attention_heads"] = 1;
  c = parse(j);
  EXPECT_EQ(c.num_attention_heads, (std::vector<int64_t>{1, 1}));
}

TEST(UNetConfig, DefaultsFollowDiffusers) {
  auto c = parse(tiny_config());
  EXPECT_EQ(c.time_embedding_dim, 32);  // 4 * block_out_channels[0]
  EXPECT_TRUE(c.flip_sin_to_cos);
  EXPECT_EQ(c.freq_shift, 0);
  EXPECT_FALSE(c.use_linear_projection);
  EXPECT_EQ(c.mid_block_type, "UNetMidBlock2DCrossAttn");
  EXPECT_EQ(c.transformer_layers_per_block, (std::vector<int64_t>{1, 1}));
  EXPECT_EQ(c.spatial_factor(), 2);
}

TEST(UNetConfig, AcceptsAHubStyleConfigWithNullKeys) {
  // The shape of stabilityai/stable-diffusion-2-1's unet/config.json: unused features are
  // written as null and must read as "absent", not as "set".
  auto j = nlohmann::json::parse(R"({
    "_class_name": "UNet2DConditionModel", "act_fn": "silu", "addition_embed_type": null,
    "addition_embed_type_num_heads": 64, "addition_time_embed_dim": null,
    "attention_head_dim": [5, 10, 20, 20], "block_out_channels": [320, 640, 1280, 1280],
    "center_input_sample": false, "class_embed_type": null, "class_embeddings_concat": false,
    "conv_in_kernel": 3, "conv_out_kernel": 3, "cross_attention_dim": 1024,
    "cross_attention_norm": null,
    "down_block_types": ["CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D",
                         "DownBlock2D"],
    "downsample_padding": 1, "dual_cross_attention": false, "encoder_hid_dim": null,
    "encoder_hid_dim_type": null, "flip_sin_to_cos": true, "freq_shift": 0, "in_channels": 4,
    "layers_per_block": 2, "mid_block_only_cross_attention": null, "mid_block_scale_factor": 1,
    "mid_block_type": "UNetMidBlock2DCrossAttn", "norm_eps": 1e-05, "norm_num_groups": 32,
    "num_attention_heads": null, "num_class_embeds": null, "only_cross_attention": false,
    "out_channels": 4, "projection_class_embeddings_input_dim": null,
    "resnet_out_scale_factor": 1.0, "resnet_skip_time_act": false,
    "resnet_time_scale_shift": "default", "sample_size": 96, "time_cond_proj_dim": null,
    "time_embedding_act_fn": null, "time_embedding_dim": null, "time_embedding_type": "positional",
    "timestep_post_act": null, "transformer_layers_per_block": 1,
    "up_block_types": ["UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D",
                       "CrossAttnUpBlock2D"],
    "upcast_attention": true, "use_linear_projection": true})");
  auto c = parse(j);
  EXPECT_EQ(c.num_attention_heads, (std::vector<int64_t>{5, 10, 20, 20}));
  EXPECT_EQ(c.cross_attention_dim[0], 1024);
  EXPECT_EQ(c.time_embedding_dim, 1280);
  EXPECT_EQ(c.sample_size, (std::vector<int64_t>{96}));
  EXPECT_TRUE(c.upcast_attention);
  EXPECT_EQ(c.spatial_factor(), 8);
}

TEST(UNetModel, ParameterNamesEqualTheDiffusersFile) {
  auto folder = io::ModelFolder::open(test::golden_model_dir());
  UNet2DConditionModel unet(UNet2DConditionConfig::from_json(folder.component_config("unet")));
  std::set<std::string> ours, theirs;
  for (const auto& p : unet->named_parameters()) ours.insert(p.key());
  for (const auto& kv : folder.component_weights("unet")) theirs.insert(kv.first);
  EXPECT_EQ(ours, theirs);
}

TEST(UNetModel, RejectsMalformedInputs) {
  auto unet = models::load_unet(io::ModelFolder::open(test::golden_model_dir()), torch::kCPU,
                                torch::kFloat32);
  const auto& c = unet->config();
  const int64_t f = c.spatial_factor(), lc = c.in_channels, cd = c.cross_attention_dim[0];
  torch::InferenceMode guard;
  auto t = torch::tensor(10);
  auto ctx = torch::randn({2, 7, cd});

  auto msg = test::expect_throw<InvalidArgument>([&] {
    unet->forward(torch::randn({2, lc + 1, f, f}), t, ctx);
  });
  EXPECT_NE(msg.find("in_channels = " + std::to_string(lc)), std::string::npos) << msg;

  // Sizes that are not a multiple of the downsampling factor work, as in diffusers.
  auto odd = unet->forward(torch::randn({2, lc, f + 1, f + f / 2 + 1}), t, ctx);
  EXPECT_EQ(odd.sizes(), (std::vector<int64_t>{2, c.out_channels, f + 1, f + f / 2 + 1}));
  EXPECT_TRUE(torch::isfinite(odd).all().item<bool>());

  msg = test::expect_throw<InvalidArgument>([&] {
    unet->forward(torch::randn({2, lc, f, f}), t, torch::randn({2, 7, cd + 1}));
  });
  EXPECT_NE(msg.find("cross_attention_dim = " + std::to_string(cd)), std::string::npos) << msg;

  msg = test::expect_throw<InvalidArgument>([&] {
    unet->forward(torch::randn({2, lc, f, f}), torch::tensor({1, 2, 3}), ctx);
  });
  EXPECT_NE(msg.find("timestep"), std::string::npos) << msg;

  msg = test::expect_throw<InvalidArgument>([&] {
    unet->forward(torch::randn({3, lc, f, f}), t, ctx);
  });
  EXPECT_NE(msg.find("batch"), std::string::npos) << msg;
}

TEST(UNetModel, ScalarIntAndFloatTimestepsAgree) {
  auto unet = models::load_unet(io::ModelFolder::open(test::golden_model_dir()), torch::kCPU,
                                torch::kFloat32);
  const auto& c = unet->config();
  torch::InferenceMode guard;
  torch::manual_seed(0);
  auto x = torch::randn({2, c.in_channels, c.spatial_factor(), 2 * c.spatial_factor()});
  auto ctx = torch::randn({2, 5, c.cross_attention_dim[0]});
  auto a = unet->forward(x, torch::tensor(int64_t{321}), ctx);
  auto b = unet->forward(x, torch::tensor({321.0}, torch::kFloat64), ctx);
  auto d = unet->forward(x, torch::tensor({321, 321}), ctx);
  EXPECT_EQ(a.sizes(), (std::vector<int64_t>{2, c.out_channels, x.size(2), x.size(3)}));
  // Same float32 timestep either way; only multithreaded summation order may differ.
  EXPECT_TRUE(torch::allclose(a, b, 0, 1e-5));
  EXPECT_TRUE(torch::allclose(a, d, 0, 1e-5));
  EXPECT_FALSE(torch::allclose(a, unet->forward(x, torch::tensor(int64_t{400}), ctx), 0, 1e-3));
}

TEST(UNetModel, ConvProjectionVariantBuildsAndRuns) {
  auto j = tiny_config();
  j["use_linear_projection"] = false;
  UNet2DConditionModel unet(parse(j));
  auto params = unet->named_parameters();
  ASSERT_TRUE(params.contains("down_blocks.0.attentions.0.proj_in.weight"));
  EXPECT_EQ(params["down_blocks.0.attentions.0.proj_in.weight"].dim(), 4);  // 1x1 conv
  EXPECT_EQ(params["up_blocks.1.attentions.1.proj_out.weight"].sizes(),
            (std::vector<int64_t>{8, 8, 1, 1}));
  EXPECT_TRUE(params.contains("mid_block.attentions.0.transformer_blocks.0.ff.net.2.weight"));

  torch::InferenceMode guard;
  torch::manual_seed(1);
  auto x = torch::randn({2, 4, 6, 10});
  models::Intermediates inter;
  auto out = unet->forward(x, torch::tensor({3, 700}), torch::randn({2, 5, 12}), &inter);
  EXPECT_EQ(out.sizes(), x.sizes());
  EXPECT_TRUE(torch::isfinite(out).all().item<bool>());
  EXPECT_EQ(inter.at("down_blocks.0").sizes(), (std::vector<int64_t>{2, 8, 3, 5}));
  EXPECT_EQ(inter.at("mid_block").sizes(), (std::vector<int64_t>{2, 16, 3, 5}));
  EXPECT_EQ(inter.at("up_blocks.1").sizes(), (std::vector<int64_t>{2, 8, 6, 10}));

  j["use_linear_projection"] = true;
  UNet2DConditionModel linear(parse(j));
  EXPECT_EQ(linear->named_parameters()["down_blocks.0.attentions.0.proj_in.weight"].dim(), 2);
}

TEST(UNetModel, UpcastAttentionInBFloat16StaysCloseToFloat32) {
  DIFFUSE_SKIP_WITHOUT_CPU_BF16();
  auto j = tiny_config();
  j["upcast_attention"] = true;
  j["use_linear_projection"] = true;
  torch::manual_seed(2);
  UNet2DConditionModel unet(parse(j));
  ASSERT_TRUE(unet->down_list[0]->attention_list[0]->blocks[0]->attn1->upcast_attention);
  torch::InferenceMode guard;
  auto x = torch::randn({2, 4, 8, 8});
  auto ctx = torch::randn({2, 5, 12});
  auto t = torch::tensor(int64_t{250});
  auto ref = unet->forward(x, t, ctx);
  unet->to(torch::kBFloat16);
  auto out = unet->forward(x.to(torch::kBFloat16), t, ctx.to(torch::kBFloat16));
  EXPECT_EQ(out.scalar_type(), torch::kBFloat16);
  auto err = (out.to(torch::kFloat32) - ref).abs().max().item<double>();
  auto scale = ref.abs().max().item<double>();
  // 5 % of the largest output: CPUs without native bf16 run LibTorch's fallback bf16 kernels
  // (3.2 % on an AVX2-only EPYC, over the 3 % this allowed before); a broken upcast gives
  // errors of the outputs' own size.
  EXPECT_LT(err, 0.05 * scale + 1e-3) << "max abs err " << err << " on outputs up to " << scale;
}

TEST(UNetLoad, ConfigThatDoesNotMatchTheWeightsIsAFormatError) {
  test::TempDir dir;
  fs::path src = test::golden_model_dir();
  fs::copy_file(src / "model_index.json", dir.path() / "model_index.json");
  fs::create_directories(dir.path() / "unet");
  fs::create_symlink(src / "unet" / "diffusion_pytorch_model.safetensors",
                     dir.path() / "unet" / "diffusion_pytorch_model.safetensors");
  auto cfg = io::JsonConfig::load((src / "unet" / "config.json").string()).json();
  cfg["cross_attention_dim"] = cfg["cross_attention_dim"].get<int64_t>() * 2;
  std::ofstream(dir.file("unet/config.json")) << cfg.dump();
  auto msg = test::expect_throw<FormatError>([&] {
    models::load_unet(io::ModelFolder::open(dir.path().string()), torch::kCPU, torch::kFloat32);
  });
  EXPECT_NE(msg.find("attn2.to_k.weight"), std::string::npos) << msg;
}

TEST(TimestepEmbedding, MatchesTheSinusoidFormula) {
  auto t = torch::tensor({0.0, 1.0, 999.0, 500.5}, torch::kFloat64);
  const int64_t dim = 8, half = 4;
  auto emb = nn::get_timestep_embedding(t, dim, /*flip_sin_to_cos=*/true, /*shift=*/1.0);
  ASSERT_EQ(emb.sizes(), (std::vector<int64_t>{4, dim}));
  EXPECT_EQ(emb.scalar_type(), torch::kFloat32);
  for (int64_t i = 0; i < 4; ++i) {
    for (int64_t k = 0; k < half; ++k) {
      double freq = std::exp(-std::log(10000.0) * k / (half - 1.0));
      double arg = t[i].item<double>() * freq;
      EXPECT_NEAR(emb[i][k].item<double>(), std::cos(arg), 2e-4 * (1 + std::abs(arg)));
      EXPECT_NEAR(emb[i][half + k].item<double>(), std::sin(arg), 2e-4 * (1 + std::abs(arg)));
    }
  }
  auto unflipped = nn::get_timestep_embedding(t, dim, false, 1.0);
  EXPECT_TRUE(torch::equal(unflipped.slice(1, 0, half), emb.slice(1, half)));
  EXPECT_EQ(nn::get_timestep_embedding(t, 7, true, 0.0).size(1), 7);  // odd dims are zero-padded
}

// SDXL's networks against diffusers: the UNet (addition_embed_type text_time: pooled text
// embedding + time ids added to the time embedding, several transformer layers per block) with
// its intermediates (add_embedding included), both CLIP encoders' penultimate states, the
// tokenizers, the VAE and the Euler schedule: every case of the SDXL golden set but the
// pipelines (the SDXL pipeline is not written yet).
TEST(UNetSdxl, GoldenComponentCasesPass) {
  const std::string dir = test::sdxl_golden_dir();
  if (!fs::exists(dir + "/cases.json")) GTEST_SKIP() << "no set at " << dir;
  verify::VerifyOptions o;
  o.components = {"unet", "text_encoder", "tokenizer", "vae", "scheduler"};
  const auto results = verify::run_all(verify::GoldenSet::load(dir), o);
  ASSERT_FALSE(results.empty());
  for (const auto& r : results) EXPECT_TRUE(r.passed) << r.name << ": " << r.reason;
}

// The added conditioning is checked: missing on an SDXL UNet, or given to a plain one.
TEST(UNetSdxl, AddedConditionsAreRequiredExactlyWhereTheConfigSaysSo) {
  auto j = tiny_config();
  j["addition_embed_type"] = "text_time";
  j["addition_time_embed_dim"] = 4;
  j["projection_class_embeddings_input_dim"] = 6 * 4 + 5;
  models::UNet2DConditionModel sdxl(parse(j));
  models::UNet2DConditionModel plain(parse(tiny_config()));
  const int64_t in = sdxl->config().in_channels, ctx = sdxl->config().cross_attention_dim[0];
  const auto x = torch::randn({2, in, 8, 8}), t = torch::tensor({10.0f, 500.0f});
  const auto ehs = torch::randn({2, 3, ctx});
  models::UNetAddedConditions added{torch::randn({2, 5}), torch::rand({2, 6}) * 512};
  EXPECT_EQ(sdxl->forward(x, t, ehs, nullptr, &added).sizes(), x.sizes());
  EXPECT_NE(test::expect_throw<InvalidArgument>([&] {
              sdxl->forward(x, t, ehs);
            }).find("text_embeds and the time_ids"),
            std::string::npos);
  models::UNetAddedConditions wrong{torch::randn({2, 7}), torch::rand({2, 6})};
  EXPECT_NE(test::expect_throw<InvalidArgument>([&] {
              sdxl->forward(x, t, ehs, nullptr, &wrong);
            }).find("projection_class_embeddings_input_dim (29)"),
            std::string::npos);
  EXPECT_NE(test::expect_throw<InvalidArgument>([&] {
              plain->forward(x, t, ehs, nullptr, &added);
            }).find("no added conditioning"),
            std::string::npos);
  // The time ids change the result (they are not ignored).
  models::UNetAddedConditions other{added.text_embeds, added.time_ids + 64};
  EXPECT_FALSE(torch::equal(sdxl->forward(x, t, ehs, nullptr, &added),
                            sdxl->forward(x, t, ehs, nullptr, &other)));
}

}  // namespace test_unet
}  // namespace diffuse
