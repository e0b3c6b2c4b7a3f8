// LoRA adapters: every "lora" case of the HiDream golden set (through the same code as
// `diffuse verify`), merged weights against an explicit W + scale * alpha/r * up @ down for
// linear and conv (1x1, 3x3) targets in both file formats, exact restore after merge /
// rescale / unmerge (float32 and bf16), peft full tensors, and the errors a bad adapter gives
// (with the weights left unchanged).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>

#include "adapters/lora.h"
#include "adapters/lora_merger.h"
#include "diffuse/errors.h"
#include "golden_case_check.h"
#include "io/json_config.h"
#include "io/lora_key_map.h"
#include "io/safetensors.h"
#include "lora_toy_network.h"
#include "models/builtin_configs.h"
#include "models/unet2d_condition.h"
#include "test_util.h"
#include "verify/verify.h"

namespace diffuse {
namespace test_lora {

namespace fs = std::filesystem;
using adapters::LoraMerger;
using adapters::LoraOptions;
using adapters::Network;
using TensorMap = std::map<std::string, torch::Tensor>;

const char* const kNoCases = "no_cases";

std::vector<std::string> lora_case_names() {
  std::vector<std::string> names;
  try {
    for (const auto& c : verify::GoldenSet::load(test::hidream_golden_dir()).cases)
      if (c.component == "lora") names.push_back(c.name);
  } catch (const std::exception&) {
    // Reported by the test itself (the set may be absent on this machine).
  }
  if (names.empty()) names.push_back(kNoCases);
  return names;
}

class LoraGoldenTest : public ::testing::TestWithParam<std::string> {};

TEST_P(LoraGoldenTest, MatchesReference) {
  if (!fs::exists(test::hidream_golden_dir() + "/cases.json"))
    GTEST_SKIP() << "no golden set at " << test::hidream_golden_dir();
  if (GetParam() == kNoCases) GTEST_SKIP() << "the set has no lora cases";
  auto set = verify::GoldenSet::load(test::hidream_golden_dir());
  const auto* c = set.find(GetParam());
  ASSERT_NE(c, nullptr);
  test::expect_golden_case_passes(set, *c);
}

INSTANTIATE_TEST_SUITE_P(HiDreamGolden, LoraGoldenTest, ::testing::ValuesIn(lora_case_names()),
                         test::case_param_name);

using test::Toy;

TensorMap snapshot(torch::nn::Module& m) {
  TensorMap out;
  for (const auto& p : m.named_parameters()) out[p.key()] = p.value().detach().clone();
  return out;
}

void expect_identical(torch::nn::Module& m, const TensorMap& before) {
  for (const auto& p : m.named_parameters())
    EXPECT_TRUE(torch::equal(p.value(), before.at(p.key()))) << p.key() << " changed";
}

torch::Tensor param(torch::nn::Module& m, const std::string& name) {
  return m.named_parameters()[name];
}

struct Fixture : ::testing::Test {
  Fixture() : toy(Toy()) {
    torch::manual_seed(7);
    for (auto& p : toy->parameters()) p.data().normal_();
  }
  std::vector<Network> nets() { return {{io::lora::unet_names(), toy.get()}}; }
  Toy toy;
};

using LoraMergeTest = Fixture;

TEST_F(LoraMergeTest, PeftLinearMatchesExplicitFormula) {
  const auto w0 = param(*toy, "attn1.to_q.weight").clone();
  auto a = torch::randn({2, 6}), b = torch::randn({5, 2});
  LoraOptions o;
  o.alpha = 8;
  o.rank = 2;  // factor 4
  auto adapter = adapters::make_lora(
      {{"unet.attn1.to_q.lora_A.weight", a}, {"unet.attn1.to_q.lora_B.weight", b}}, {}, "test",
      nets(), o);
  EXPECT_EQ(adapter.touched.at("unet"), 1);
  LoraMerger merger(nets());
  merger.add(adapter, 0.75);
  auto expected = w0 + 0.75 * 4.0 * torch::matmul(b, a);
  EXPECT_TRUE(torch::allclose(param(*toy, "attn1.to_q.weight"), expected, 1e-5, 1e-6));
}

TEST_F(LoraMergeTest, KohyaConvAndListIndexMatchExplicitFormula) {
  const auto conv0 = param(*toy, "conv_in.weight").clone();
  const auto proj0 = param(*toy, "proj_in.weight").clone();
  const auto out0 = param(*toy, "attn1.to_out.0.weight").clone();
  auto cd = torch::randn({3, 4, 3, 3}), cu = torch::randn({3, 3, 1, 1});
  auto pd = torch::randn({2, 4}), pu = torch::randn({3, 2});  // linear-style pair on a 1x1 conv
  auto od = torch::randn({2, 5, 1, 1}), ou = torch::randn({6, 2, 1, 1});  // conv pair on a linear
  TensorMap t = {{"lora_unet_conv_in.lora_down.weight", cd},
                 {"lora_unet_conv_in.lora_up.weight", cu},
                 {"lora_unet_conv_in.alpha", torch::tensor(1.5)},
                 {"lora_unet_proj_in.lora_down.weight", pd},
                 {"lora_unet_proj_in.lora_up.weight", pu},
                 {"lora_unet_attn1_to_out_0.lora_down.weight", od},
                 {"lora_unet_attn1_to_out_0.lora_up.weight", ou}};
  LoraMerger merger(nets());
  merger.add(adapters::make_lora(t, {}, "kohya", nets()), -0.5);
  auto conv_delta = torch::matmul(cu.flatten(1), cd.flatten(1)).view({3, 4, 3, 3});
  EXPECT_TRUE(torch::allclose(param(*toy, "conv_in.weight"), conv0 - 0.5 * (1.5 / 3) * conv_delta,
                              1e-5, 1e-6));
  EXPECT_TRUE(torch::allclose(param(*toy, "proj_in.weight"),
                              proj0 - 0.5 * torch::matmul(pu, pd).view({3, 4, 1, 1}), 1e-5, 1e-6));
  EXPECT_TRUE(torch::allclose(param(*toy, "attn1.to_out.0.weight"),
                              out0 - 0.5 * torch::matmul(ou.flatten(1), od.flatten(1)), 1e-5,
                              1e-6));
}

TEST_F(LoraMergeTest, AdaptersAddAndUnmergeIsBitIdentical) {
  for (auto dtype : {torch::kFloat32, torch::kBFloat16}) {
    toy->to(dtype);
    const auto before = snapshot(*toy);
    TensorMap t1 = {{"unet.attn1.to_q.lora_A.weight", torch::randn({2, 6})},
                    {"unet.attn1.to_q.lora_B.weight", torch::randn({5, 2})},
                    {"unet.conv_in.lora_A.weight", torch::randn({2, 4, 3, 3})},
                    {"unet.conv_in.lora_B.weight", torch::randn({3, 2, 1, 1})}};
    TensorMap t2 = {{"lora_unet_attn1_to_q.lora_down.weight", torch::randn({3, 6})},
                    {"lora_unet_attn1_to_q.lora_up.weight", torch::randn({5, 3})}};
    LoraMerger merger(nets());
    const int a = merger.add(adapters::make_lora(t1, {}, "a", nets()), 1.0);
    const int b = merger.add(adapters::make_lora(t2, {}, "b", nets()), -0.3);
    // Two adapters on one weight: their updates add up (float32 accumulation, one cast).
    auto expected = (before.at("attn1.to_q.weight").to(torch::kFloat32) +
                     torch::matmul(t1.at("unet.attn1.to_q.lora_B.weight"),
                                   t1.at("unet.attn1.to_q.lora_A.weight")) -
                     0.3 * torch::matmul(t2.at("lora_unet_attn1_to_q.lora_up.weight"),
                                         t2.at("lora_unet_attn1_to_q.lora_down.weight")))
                        .to(dtype);
    EXPECT_TRUE(torch::allclose(param(*toy, "attn1.to_q.weight").to(torch::kFloat32),
                                expected.to(torch::kFloat32), 2e-2, 1e-5));
    EXPECT_FALSE(torch::equal(param(*toy, "conv_in.weight"), before.at("conv_in.weight")));
    merger.set_scale(a, 2.5);
    merger.set_scale(b, 0.0);
    merger.remove(a);
    // Only b is left (scale 0): every weight is its original again.
    expect_identical(*toy, before);
    merger.set_scale(b, 1.0);
    merger.set_lora_enabled(false);
    expect_identical(*toy, before);
    merger.set_lora_enabled(true);
    merger.clear();
    expect_identical(*toy, before);
    EXPECT_EQ(merger.patched_weights(), 0u);
  }
}

TEST_F(LoraMergeTest, FullTensorsStayWhenLoraIsDisabled) {
  const auto before = snapshot(*toy);
  auto replacement = torch::randn({5});
  TensorMap t = {{"unet.attn1.to_q.lora_A.weight", torch::randn({2, 6})},
                 {"unet.attn1.to_q.lora_B.weight", torch::randn({5, 2})},
                 {"unet.attn1.to_q.base_layer.bias", replacement}};
  LoraMerger merger(nets());
  merger.add(adapters::make_lora(t, {}, "full", nets()), 1.0);
  EXPECT_TRUE(torch::equal(param(*toy, "attn1.to_q.bias"), replacement));
  const auto patched = param(*toy, "attn1.to_q.weight").clone();
  merger.set_lora_enabled(false);
  EXPECT_TRUE(torch::equal(param(*toy, "attn1.to_q.weight"), before.at("attn1.to_q.weight")));
  EXPECT_TRUE(torch::equal(param(*toy, "attn1.to_q.bias"), replacement));
  // On again (HiDream-E1-Full's next edit after a refine phase): the pair-only weight is
  // patched again, not left at its original.
  merger.set_lora_enabled(true);
  EXPECT_TRUE(torch::equal(param(*toy, "attn1.to_q.weight"), patched));
  merger.clear();
  expect_identical(*toy, before);
}

TEST(LoraKeys, KohyaTextEncoderNamesMapOntoModules) {
  io::lora::ModuleIndex te(io::lora::text_encoder_names(),
                           {"text_model.encoder.layers.0.self_attn.q_proj.weight",
                            "text_model.encoder.layers.0.self_attn.q_proj.bias"});
  for (const std::string prefix : {"lora_te_", "lora_te1_"}) {
    io::lora::PairKeys p;
    p.prefix = prefix + "text_model_encoder_layers_0_self_attn_q_proj";
    p.kohya = true;
    EXPECT_EQ(te.pair_target(p), "text_model.encoder.layers.0.self_attn.q_proj.weight");
  }
  io::lora::PairKeys other;
  other.prefix = "lora_te2_text_model_encoder_layers_0_self_attn_q_proj";
  other.kohya = true;
  EXPECT_EQ(te.pair_target(other), "");
  // Older diffusers: processor LoRA names the projections of the processor's owner.
  io::lora::ModuleIndex unet(io::lora::unet_names(), {"mid_block.attn1.to_out.0.weight"});
  auto keys = io::lora::group_keys({"unet.mid_block.attn1.processor.to_out_lora.down.weight",
                                    "unet.mid_block.attn1.processor.to_out_lora.up.weight"},
                                   "old");
  ASSERT_EQ(keys.pairs.size(), 1u);
  EXPECT_EQ(unet.pair_target(keys.pairs[0]), "mid_block.attn1.to_out.0.weight");
}

// kohya files from LDM-based trainers name UNet modules as the original single-file layout does;
// the numbering of input_blocks / output_blocks comes from the model's own block structure
// (here SD2.1's, at small width).
TEST(LoraKeys, KohyaOriginalLayoutNamesMapOntoUNetModules) {
  auto config = models::builtin_arch("tiny").unet;
  config["layers_per_block"] = 2;  // as SD2.1 has
  models::UNet2DConditionModel unet(
      models::UNet2DConditionConfig::from_json(io::JsonConfig(config, "tiny unet")));
  std::vector<std::string> names;
  for (const auto& p : unet->named_parameters()) names.push_back(p.key());
  io::lora::ModuleIndex index(io::lora::unet_names(), names);
  const std::vector<std::pair<std::string, std::string>> expected = {
      {"input_blocks_0_0", "conv_in"},
      {"time_embed_2", "time_embedding.linear_2"},
      {"input_blocks_1_1_transformer_blocks_0_attn1_to_q",
       "down_blocks.0.attentions.0.transformer_blocks.0.attn1.to_q"},
      {"input_blocks_2_0_in_layers_2", "down_blocks.0.resnets.1.conv1"},
      {"input_blocks_3_0_op", "down_blocks.0.downsamplers.0.conv"},
      {"input_blocks_4_0_skip_connection", "down_blocks.1.resnets.0.conv_shortcut"},
      {"input_blocks_11_0_emb_layers_1", "down_blocks.3.resnets.1.time_emb_proj"},
      {"middle_block_1_proj_in", "mid_block.attentions.0.proj_in"},
      {"middle_block_2_out_layers_3", "mid_block.resnets.1.conv2"},
      {"output_blocks_2_1_conv", "up_blocks.0.upsamplers.0.conv"},
      {"output_blocks_3_1_transformer_blocks_0_ff_net_2",
       "up_blocks.1.attentions.0.transformer_blocks.0.ff.net.2"},
      {"output_blocks_5_2_conv", "up_blocks.1.upsamplers.0.conv"},
      {"output_blocks_11_1_proj_out", "up_blocks.3.attentions.2.proj_out"},
      {"out_2", "conv_out"}};
  for (const auto& [ldm, ours] : expected) {
    io::lora::PairKeys p;
    p.prefix = "lora_unet_" + ldm;
    p.kohya = true;
    EXPECT_EQ(index.pair_target(p), ours + ".weight") << ldm;
  }
  io::lora::PairKeys diffusers_named;  // the diffusers names still work
  diffusers_named.prefix = "lora_unet_down_blocks_0_attentions_0_proj_in";
  diffusers_named.kohya = true;
  EXPECT_EQ(index.pair_target(diffusers_named), "down_blocks.0.attentions.0.proj_in.weight");
}

TEST(LoraKeys, MalformedKeySetsNameTheKey) {
  auto expect_error = [](const std::vector<std::string>& keys, const std::string& part) {
    try {
      io::lora::group_keys(keys, "f.safetensors");
      ADD_FAILURE() << "no error for " << part;
    } catch (const FormatError& e) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
    }
  };
  expect_error({"lora_unet_x.lora_down.weight"}, "lora_unet_x.lora_down.weight");
  expect_error({"a.lora_A.default.weight", "a.lora_B.default.weight", "b.lora_A.other.weight",
                "b.lora_B.other.weight"},
               "several peft adapters");
  expect_error({"a.lora_A.weight", "a.lora_B.weight", "a.lora_magnitude_vector"},
               "a.lora_magnitude_vector");
  expect_error({"lora_unet_y.alpha"}, "lora_unet_y.alpha");
}

// Errors of bad adapters name the key, and leave the model unchanged.
class LoraBadAdapterTest : public Fixture {
 protected:
  TensorMap good() {
    return {{"unet.attn1.to_q.lora_A.weight", torch::randn({2, 6})},
            {"unet.attn1.to_q.lora_B.weight", torch::randn({5, 2})},
            {"unet.conv_in.lora_A.weight", torch::randn({2, 4, 3, 3})},
            {"unet.conv_in.lora_B.weight", torch::randn({3, 2, 1, 1})}};
  }
  void expect_rejected(const TensorMap& t, const std::string& part, bool lenient = false) {
    const auto before = snapshot(*toy);
    const std::string path = (fs::path(tmp.path()) / "bad.safetensors").string();
    io::save_safetensors(path, {t.begin(), t.end()});
    LoraMerger merger(nets());
    LoraOptions o;
    o.lenient = lenient;
    try {
      merger.add(path, 1.0, o);
      ADD_FAILURE() << "no error (expected one naming " << part << ")";
    } catch (const FormatError& e) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    }
    expect_identical(*toy, before);
  }
  test::TempDir tmp;
};

TEST_F(LoraBadAdapterTest, RankMismatch) {
  auto t = good();
  t["unet.conv_in.lora_B.weight"] = torch::randn({3, 4, 1, 1});
  expect_rejected(t, "rank mismatch: 'unet.conv_in.lora_A.weight' has rank 2");
}

TEST_F(LoraBadAdapterTest, ShapeThatFitsNoTarget) {
  auto t = good();
  t["unet.conv_in.lora_A.weight"] = torch::randn({2, 4, 1, 1});  // 1x1 pair on a 3x3 conv
  expect_rejected(t, "'unet.conv_in' gives an update of shape [3, 4, 1, 1]");
  t = good();
  t["unet.attn1.to_q.lora_B.weight"] = torch::randn({7, 2});
  expect_rejected(t, "fits no target");
}

TEST_F(LoraBadAdapterTest, IntegerTensorsRankZeroAndALayerNamedTwice) {
  auto t = good();
  t["unet.attn1.to_q.lora_B.weight"] = torch::ones({5, 2}, torch::kInt32);
  expect_rejected(t, "'unet.attn1.to_q.lora_B.weight' holds Int values");
  t = good();
  t["unet.attn1.to_q.lora_A.weight"] = torch::zeros({0, 6});
  t["unet.attn1.to_q.lora_B.weight"] = torch::zeros({5, 0});
  expect_rejected(t, "has rank 0");
  // The same layer once in peft's names and once in kohya's.
  t = good();
  t["lora_unet_attn1_to_q.lora_down.weight"] = torch::randn({2, 6});
  t["lora_unet_attn1_to_q.lora_up.weight"] = torch::randn({5, 2});
  expect_rejected(t, "the file names one layer twice");
}

TEST_F(LoraBadAdapterTest, AnAlphaThatWouldOverflowTheWeights) {
  TensorMap t = {{"lora_unet_attn1_to_q.lora_down.weight", torch::randn({2, 6})},
                 {"lora_unet_attn1_to_q.lora_up.weight", torch::randn({5, 2})},
                 {"lora_unet_attn1_to_q.alpha", torch::tensor(1e30)}};
  expect_rejected(t, "(from tensor 'lora_unet_attn1_to_q.alpha') over rank 2 scales the update");
  t["lora_unet_attn1_to_q.alpha"] = torch::tensor(16.0);  // 8x: a strong but real adapter
  LoraMerger merger(nets());
  const std::string path = (fs::path(tmp.path()) / "strong.safetensors").string();
  io::save_safetensors(path, {t.begin(), t.end()});
  EXPECT_NO_THROW(merger.add(path, 1.0, LoraOptions{}));
}

TEST_F(LoraBadAdapterTest, NaNValues) {
  auto t = good();
  t["unet.attn1.to_q.lora_B.weight"][1][1] = std::nan("");
  expect_rejected(t, "'unet.attn1.to_q.lora_B.weight' holds NaN");
}

TEST_F(LoraBadAdapterTest, KeysThatMatchNothing) {
  auto t = good();
  t["unet.attn9.to_q.lora_A.weight"] = torch::randn({2, 6});
  t["unet.attn9.to_q.lora_B.weight"] = torch::randn({5, 2});
  expect_rejected(
      t, "1 entries (LoRA pairs or full tensors) match no weight of unet: 'unet.attn9.to_q'");
  // Lenient: the rest is applied and the skipped pair reported.
  auto adapter = adapters::make_lora(t, {}, "lenient", nets(), [] {
    LoraOptions o;
    o.lenient = true;
    return o;
  }());
  EXPECT_EQ(adapter.pairs.size(), 2u);
  ASSERT_EQ(adapter.warnings.size(), 1u);
  EXPECT_NE(adapter.warnings[0].find("unet.attn9.to_q"), std::string::npos);
}

TEST_F(LoraBadAdapterTest, TruncatedFile) {
  const auto before = snapshot(*toy);
  auto t = good();
  const std::string path = (fs::path(tmp.path()) / "cut.safetensors").string();
  io::save_safetensors(path, {t.begin(), t.end()});
  fs::resize_file(path, fs::file_size(path) - 16);
  LoraMerger merger(nets());
  EXPECT_THROW(merger.add(path, 1.0), FormatError);
  expect_identical(*toy, before);
}

}  // namespace test_lora
}  // namespace diffuse
