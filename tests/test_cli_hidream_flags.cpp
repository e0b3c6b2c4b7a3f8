// `diffuse txt2img` on a HiDream folder: every flag it offers either works (--json, --lora,
// --scheduler with the flow schedulers, --offload as weight streaming) or is refused with a
// message that says why; none is dropped without a word (issue 36).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "cli_run.h"
#include "diffuse/image.h"
#include "io/safetensors.h"
#include "test_util.h"
#include "verify/golden.h"

namespace diffuse {
namespace test_cli_hidream_flags {

using test::run_cli;

class DitCliFlags : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string set = test::hidream_golden_dir();
    if (!std::filesystem::exists(set + "/cases.json")) GTEST_SKIP() << "no set at " << set;
    model_ = verify::GoldenSet::load(set).model_dir();
  }
  // txt2img with 2 steps and a fixed seed, plus `more`.
  test::CliRun txt2img(const std::string& out, const std::vector<std::string>& more) {
    std::vector<std::string> args = {"txt2img", "-m",     model_, "-p", "a red fox",   "--steps",
                                     "2",       "--seed", "3",    "-o", dir_.file(out)};
    args.insert(args.end(), more.begin(), more.end());
    return run_cli(args, dir_);
  }
  std::string model_;
  test::TempDir dir_;
};

TEST_F(DitCliFlags, JsonPrintsTheSummaryAndNothingElse) {
  const auto r = txt2img("a.png", {"--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << "stdout is not JSON alone: " << r.out;
  EXPECT_EQ(j["files"], nlohmann::json::array({dir_.file("a.png")}));
  EXPECT_EQ(j["seed"], 3);
  for (const char* key : {"text_encode_s", "denoise_s", "step_s", "vae_decode_s", "total_s"}) {
    ASSERT_TRUE(j.contains(key)) << key;
    EXPECT_GT(j[key].get<double>(), 0.0) << key;
  }
  EXPECT_GT(j["peak_rss_mb"].get<double>(), 0.0);
  EXPECT_TRUE(j["memory"].is_array());
  EXPECT_TRUE(j["cpu"].is_object());
  EXPECT_EQ(j["loras"], nlohmann::json::array());
  EXPECT_FALSE(j["scheduler"].get<std::string>().empty());
}

TEST_F(DitCliFlags, FlowSchedulersByNameAndTheOthersRefused) {
  const auto euler = txt2img("euler.png", {"--json", "--scheduler", "flow_euler"});
  ASSERT_EQ(euler.exit_code, 0) << euler.err;
  EXPECT_EQ(nlohmann::json::parse(euler.out)["scheduler"], "FlowMatchEulerDiscreteScheduler");
  const auto own = txt2img("own.png", {"--quiet"});
  ASSERT_EQ(own.exit_code, 0) << own.err;
  for (const std::string name : {"euler", "ddim", "no_such"}) {
    const auto r = txt2img("x.png", {"--scheduler", name});
    EXPECT_NE(r.exit_code, 0) << name;
    EXPECT_NE(r.err.find("flow-matching schedulers: flow_euler"), std::string::npos) << r.err;
    EXPECT_FALSE(std::filesystem::exists(dir_.file("x.png")));
  }
}

TEST_F(DitCliFlags, LoraOnTheTransformerChangesTheImageAndANonLoraFileIsRefused) {
  const auto plain = txt2img("plain.png", {"--quiet"});
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  const auto with = txt2img("lora.png", {"--json", "--lora", model_ + "/e1_lora.safetensors:0.8"});
  ASSERT_EQ(with.exit_code, 0) << with.err;
  const auto j = nlohmann::json::parse(with.out);
  ASSERT_EQ(j["loras"].size(), 1u);
  EXPECT_NE(j["loras"][0].get<std::string>().find("(scale 0.8)"), std::string::npos);
  EXPECT_NE(read_png(dir_.file("plain.png")).rgb, read_png(dir_.file("lora.png")).rgb);

  const std::string not_lora = dir_.file("not_a_lora.safetensors");
  io::save_safetensors(not_lora, {{"some.weight", torch::ones({4, 4})}});
  const auto bad = txt2img("bad.png", {"--lora", not_lora});
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.err.find(not_lora), std::string::npos) << bad.err;
  EXPECT_FALSE(std::filesystem::exists(dir_.file("bad.png")));
}

TEST_F(DitCliFlags, OffloadStreamsTheTransformerToTheSameImage) {
  const auto plain = txt2img("plain.png", {"--quiet"});
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  const auto offload = txt2img("offload.png", {"--quiet", "--offload"});
  ASSERT_EQ(offload.exit_code, 0) << offload.err;
  EXPECT_EQ(read_png(dir_.file("plain.png")).rgb, read_png(dir_.file("offload.png")).rgb);
}

TEST_F(DitCliFlags, FlagsItCannotHonourAreRefusedWithTheReason) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--prompt-syntax", "a1111"}, "as written"},
      {{"--lora-dir", dir_.path().string()}, "--lora PATH"},
      {{"--vae-dtype", "bf16"}, "float32"},
      {{"--no-pack-weights"}, "Stable Diffusion UNet"},
      {{"--lora-mode", "unmerged"}, "merged"},
      {{"--config", model_}, "single-file"},
      {{"--deepcache", "3"}, "UNet"},
  };
  for (const auto& [flags, reason] : cases) {
    SCOPED_TRACE(flags[0]);
    const auto r = txt2img("x.png", flags);
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.err.find(flags[0]), std::string::npos) << r.err;
    EXPECT_NE(r.err.find(reason), std::string::npos) << r.err;
    EXPECT_FALSE(std::filesystem::exists(dir_.file("x.png")));
  }
  const auto i2i = run_cli(
      {"img2img", "-m", model_, "-p", "x", "-i", dir_.file("none.png"), "-o", dir_.file("x.png")},
      dir_);
  EXPECT_NE(i2i.exit_code, 0);
  EXPECT_NE(i2i.err.find("not img2img"), std::string::npos) << i2i.err;
}

// --weights q8_0 / int8 keep the transformer's linear weights quantized and say so; a type it
// does not take is refused before the load, naming the flag; with --offload (weight streaming)
// it is refused too, since streaming reads the plain weights.
TEST_F(DitCliFlags, WeightsQuantizeTheTransformerOrAreRefused) {
  for (const std::string type : {"q8_0", "int8"}) {
    const auto q = txt2img(type + ".png", {"--weights", type});
    ASSERT_EQ(q.exit_code, 0) << q.err;
    EXPECT_NE(q.err.find("weights " + type + ": "), std::string::npos) << q.err;
    EXPECT_TRUE(std::filesystem::exists(dir_.file(type + ".png")));
  }
  for (const auto& [flags, needle] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"--weights", "fp8"}, "--weights 'fp8'"},
           {{"--weights", "q8_0", "--offload"}, "streaming"}}) {
    SCOPED_TRACE(flags[1]);
    const auto r = txt2img("x.png", flags);
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.err.find(needle), std::string::npos) << r.err;
    EXPECT_FALSE(std::filesystem::exists(dir_.file("x.png")));
  }
}

// Guidance and LoRA values the server refuses are refused here too, naming the flag (issue 45).
TEST_F(DitCliFlags, OutOfRangeGuidanceAndLoraRankAreRefused) {
  for (const auto& [flags, needle] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"--cfg-scale", "-5"}, "--cfg-scale"}, {{"--cfg-scale", "1e9"}, "--cfg-scale"}}) {
    const auto r = txt2img("bad.png", flags);
    EXPECT_NE(r.exit_code, 0) << needle;
    EXPECT_NE(r.err.find(needle), std::string::npos) << r.err;
    EXPECT_FALSE(std::filesystem::exists(dir_.file("bad.png")));
  }
  const auto png = dir_.file("src.png");
  ASSERT_EQ(txt2img("src.png", {}).exit_code, 0);
  for (const auto& [flags, needle] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"--image-guidance", "-1"}, "--image-guidance"},
           {{"--e1-lora", png, "--lora-rank", "0"}, "--lora-rank"},
           {{"--e1-lora", png, "--lora-rank", "-4"}, "--lora-rank"}}) {
    std::vector<std::string> args = {"edit",
                                     "-m",
                                     model_,
                                     "-i",
                                     png,
                                     "-p",
                                     "make it red",
                                     "--steps",
                                     "1",
                                     "-o",
                                     dir_.file("bad.png")};
    args.insert(args.end(), flags.begin(), flags.end());
    const auto r = run_cli(args, dir_);
    EXPECT_NE(r.exit_code, 0) << needle;
    EXPECT_NE(r.err.find(needle), std::string::npos) << r.err;
    EXPECT_FALSE(std::filesystem::exists(dir_.file("bad.png")));
  }
}

}  // namespace test_cli_hidream_flags
}  // namespace diffuse
