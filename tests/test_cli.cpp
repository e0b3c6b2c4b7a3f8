// The `diffuse` binary as a user runs it: golden pipeline cases end to end through the CLI
// (PNG output), and bad input giving one clear line, a non-zero exit and no output file.
#include <gtest/gtest.h>
#include <httplib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <torch/torch.h>
#include <unistd.h>

#include <array>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli_run.h"
#include "diffuse/image.h"
#include "io/json_config.h"
#include "io/safetensors.h"
#include "schedulers/scheduler.h"
#include "test_util.h"
#include "verify/golden.h"

namespace diffuse {
namespace test_cli {

using RunResult = test::CliRun;
using test::run_cli;

// The CLI scheduler name whose class is `class_name` when built from `base`.
std::string scheduler_flag_for(const std::string& class_name, const io::JsonConfig& base) {
  for (const auto& name : schedulers::scheduler_names())
    if (schedulers::make_scheduler(name, base)->class_name() == class_name) return name;
  return "";
}

// Every txt2img golden case (one with supplied latents), run through the CLI from the
// diffusers folder and from the single-file checkpoint; the PNG must equal the reference
// image up to 8-bit rounding.
TEST(Cli, GoldenTxt2ImgCasesThroughTheCli) {
  auto set = verify::GoldenSet::load(test::golden_dir());
  int ran = 0;
  for (const auto& c : set.cases) {
    if (c.component != "pipeline") continue;
    verify::CaseTensors t(c);
    if (!t.has("latents") || !t.has("image")) continue;
    const auto& p = c.params;
    test::TempDir dir;
    std::vector<std::string> args = {"txt2img",     "--device", "cpu",       "--dtype", "fp32",
                                     "--vae-dtype", "fp32",     "--latents", c.file,    "--quiet"};
    for (const auto& s : verify::string_list(p.value("prompt", nlohmann::json())))
      args.insert(args.end(), {"--prompt", s});
    for (const auto& s : verify::string_list(p.value("negative_prompt", nlohmann::json())))
      args.insert(args.end(), {"--negative-prompt", s});
    args.insert(args.end(), {"--steps", std::to_string(p.value("num_inference_steps", 50)),
                             "--cfg-scale", std::to_string(p.value("guidance_scale", 7.5)),
                             "--width", std::to_string(p.value("width", 0)), "--height",
                             std::to_string(p.value("height", 0))});
    if (p.contains("scheduler")) {
      io::JsonConfig sc(p["scheduler"], c.name + " scheduler");
      auto flag = scheduler_flag_for(sc.get<std::string>("_class_name", ""), sc);
      ASSERT_FALSE(flag.empty()) << c.name;
      args.insert(args.end(), {"--scheduler", flag});
    }
    auto expected = t.get("image");  // [N, H, W, 3] in [0, 1]
    std::vector<std::pair<std::string, std::vector<std::string>>> sources = {
        {"folder", {"--model", set.model_dir()}}};
    if (!set.single_file_checkpoint().empty())
      sources.push_back(
          {"single-file-offload",
           {"--model", set.single_file_checkpoint(), "--config", set.model_dir(), "--offload"}});
    for (const auto& [label, model_args] : sources) {
      auto a = args;
      a.insert(a.end(), model_args.begin(), model_args.end());
      a.insert(a.end(), {"--out", dir.file(label + ".png")});
      auto r = run_cli(a, dir);
      ASSERT_EQ(r.exit_code, 0) << c.name << " " << label << ": " << r.err;
      for (int64_t i = 0; i < expected.size(0); ++i) {
        std::string path = expected.size(0) > 1 ? dir.file(label + "-" + std::to_string(i) + ".png")
                                                : dir.file(label + ".png");
        auto img = read_png(path);
        ASSERT_EQ(img.height, expected.size(1));
        ASSERT_EQ(img.width, expected.size(2));
        auto got = torch::from_blob(img.rgb.data(), {img.height, img.width, 3}, torch::kUInt8)
                       .to(torch::kFloat64) /
                   255.0;
        double err = (got - expected[i].to(torch::kFloat64)).abs().max().item<double>();
        EXPECT_LE(err, 0.5 / 255.0 + c.tol("atol", 1e-4) + 1e-9)
            << c.name << " " << label << " image " << i;
        auto text = read_png_text(path);
        EXPECT_NE(
            text.at("parameters").find(verify::string_list(p["prompt"])[static_cast<size_t>(i)]),
            std::string::npos);
        auto meta = nlohmann::json::parse(text.at("diffuse"));
        EXPECT_EQ(meta["steps"], p.value("num_inference_steps", 50));
      }
    }
    ++ran;
  }
  if (ran == 0) GTEST_SKIP() << "no txt2img pipeline case with supplied latents in this golden set";
}

TEST(Cli, SeedMakesRunsRepeatableAndIsRecorded) {
  test::TempDir dir;
  auto set = verify::GoldenSet::load(test::golden_dir());
  std::vector<std::string> base = {
      "txt2img", "-m", set.model_dir(), "-p", "a fox",   "--steps", "2", "-W", "64",
      "-H",      "64", "--seed",        "7",  "--quiet", "--json"};
  auto a = base;
  a.insert(a.end(), {"-o", dir.file("a.png")});
  auto b = base;
  b.insert(b.end(), {"-o", dir.file("b.png"), "--batch-count", "2"});
  auto ra = run_cli(a, dir);
  ASSERT_EQ(ra.exit_code, 0) << ra.err;
  auto rb = run_cli(b, dir);
  ASSERT_EQ(rb.exit_code, 0) << rb.err;
  auto summary = nlohmann::json::parse(rb.out);
  ASSERT_EQ(summary["files"].size(), 2u);
  EXPECT_EQ(summary["seed"], 7);
  for (const char* key :
       {"device", "dtype", "load_s", "text_encode_s", "denoise_s", "vae_decode_s", "peak_rss_mb"})
    EXPECT_TRUE(summary.contains(key)) << key;
  // --batch-count 2 runs seeds 7 and 8: the first equals the single run with seed 7.
  EXPECT_EQ(read_png(dir.file("a.png")).rgb, read_png(dir.file("b-0.png")).rgb);
  EXPECT_NE(read_png(dir.file("b-0.png")).rgb, read_png(dir.file("b-1.png")).rgb);
  EXPECT_NE(read_png_text(dir.file("b-1.png")).at("parameters").find("Seed: 8"), std::string::npos);
}

// --lora PATH[:SCALE]: the adapter changes the image and is reported; scale 0 gives the plain
// image; an adapter for another network fails with one line and no output.
TEST(Cli, LoraFlagTakesPathAndScale) {
  test::TempDir dir;
  auto set = verify::GoldenSet::load(test::golden_dir());
  torch::manual_seed(3);
  auto conv =
      io::SafetensorsFile::open(set.model_dir() + "/unet/diffusion_pytorch_model.safetensors")
          ->get("conv_in.weight");
  const std::string lora = dir.file("conv.safetensors");
  io::save_safetensors(lora,
                       {{"lora_unet_conv_in.lora_down.weight",
                         torch::randn({2, conv.size(1), conv.size(2), conv.size(3)})},
                        {"lora_unet_conv_in.lora_up.weight", torch::randn({conv.size(0), 2})}});
  const std::string other = dir.file("other.safetensors");
  io::save_safetensors(other, {{"lora_unet_nothing.lora_down.weight", torch::randn({2, 4})},
                               {"lora_unet_nothing.lora_up.weight", torch::randn({4, 2})}});
  std::vector<std::string> base = {
      "txt2img", "-m", set.model_dir(), "-p", "a fox",  "--steps", "2", "-W", "64",
      "-H",      "64", "--seed",        "7",  "--quiet"};
  auto run = [&](const std::string& out, const std::vector<std::string>& extra) {
    auto a = base;
    a.insert(a.end(), {"-o", dir.file(out)});
    a.insert(a.end(), extra.begin(), extra.end());
    return run_cli(a, dir);
  };
  auto plain = run("plain.png", {});
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  auto with = run("lora.png", {"--lora", lora + ":0.5", "--json"});
  ASSERT_EQ(with.exit_code, 0) << with.err;
  auto summary = nlohmann::json::parse(with.out);
  ASSERT_EQ(summary["loras"].size(), 1u);
  EXPECT_NE(summary["loras"][0].get<std::string>().find("(scale 0.5)"), std::string::npos);
  EXPECT_NE(read_png(dir.file("plain.png")).rgb, read_png(dir.file("lora.png")).rgb);
  auto zero = run("zero.png", {"--lora", lora + ":0"});
  ASSERT_EQ(zero.exit_code, 0) << zero.err;
  EXPECT_EQ(read_png(dir.file("plain.png")).rgb, read_png(dir.file("zero.png")).rgb);
  auto bad = run("bad.png", {"--lora", other});
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.err.find("lora_unet_nothing"), std::string::npos) << bad.err;
  EXPECT_FALSE(std::ifstream(dir.file("bad.png")).good());

  // A1111's <lora:NAME:SCALE> in the prompt, resolved in --lora-dir: the same image as --lora,
  // and the tag is not part of the prompt the text encoder sees.
  auto tagged = run_cli({"txt2img", "-m", set.model_dir(), "-p", "a fox <lora:conv:0.5>", "--steps",
                         "2", "-W", "64", "-H", "64", "--seed", "7", "--quiet", "--lora-dir",
                         dir.path().string(), "-o", dir.file("tag.png")},
                        dir);
  ASSERT_EQ(tagged.exit_code, 0) << tagged.err;
  EXPECT_EQ(read_png(dir.file("tag.png")).rgb, read_png(dir.file("lora.png")).rgb);
  auto no_dir = run_cli(
      {"txt2img", "-m", set.model_dir(), "-p", "a fox <lora:conv>", "-o", dir.file("nodir.png")},
      dir);
  EXPECT_NE(no_dir.exit_code, 0);
  EXPECT_NE(no_dir.err.find("needs --lora-dir"), std::string::npos) << no_dir.err;
  auto missing = run_cli({"txt2img", "-m", set.model_dir(), "-p", "a fox <lora:../conv>",
                          "--lora-dir", dir.path().string(), "-o", dir.file("up.png")},
                         dir);
  EXPECT_NE(missing.exit_code, 0);
  EXPECT_NE(missing.err.find("inside the folder"), std::string::npos) << missing.err;
}

TEST(Cli, Img2ImgFromAPng) {
  test::TempDir dir;
  auto set = verify::GoldenSet::load(test::golden_dir());
  Image init;
  init.width = 64;
  init.height = 48;
  init.rgb.resize(64 * 48 * 3);
  for (size_t i = 0; i < init.rgb.size(); ++i) init.rgb[i] = static_cast<uint8_t>(i % 251);
  write_png(dir.file("in.png"), init);
  auto r = run_cli(
      {"img2img", "-m", set.model_dir(), "-p", "a fox", "-i", dir.file("in.png"), "--strength",
       "0.5", "--steps", "4", "--seed", "1", "--quiet", "-o", dir.file("out.png")},
      dir);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto out = read_png(dir.file("out.png"));
  EXPECT_EQ(out.width, 64);
  EXPECT_EQ(out.height, 48);
  EXPECT_NE(read_png_text(dir.file("out.png")).at("parameters").find("Denoising strength: 0.5"),
            std::string::npos);
}

// The HiDream golden pipeline cases through the CLI, wherever the CLI can state the case: the
// folder's own scheduler (it has no flag for another scheduler config), the model's own area
// for text-to-image, 128-token prompts, refine only with the set's E1 LoRA file. Initial
// latents and a stochastic scheduler's noise come from the case file (--latents,
// --step-noise); the PNG must be the reference image to 8 bits.
TEST(Cli, HiDreamGoldenPipelineCasesThroughTheCli) {
  const std::string set_dir = test::hidream_golden_dir();
  if (!std::filesystem::exists(set_dir + "/cases.json")) GTEST_SKIP() << "no set at " << set_dir;
  const auto set = verify::GoldenSet::load(set_dir);
  const std::string model = set.model_dir();
  const auto read_json = [](const std::string& path) {
    std::ifstream in(path);
    return nlohmann::json::parse(in);
  };
  const auto folder_scheduler = read_json(model + "/scheduler/scheduler_config.json");
  const auto max_resolution = read_json(model + "/transformer/config.json")["max_resolution"];
  int ran = 0;
  for (const auto& c : set.cases) {
    if (c.component != "pipeline") continue;
    const auto& p = c.params;
    bool same_scheduler = p.contains("scheduler");
    if (same_scheduler)
      for (const auto& [key, value] : p["scheduler"].items())
        if (key != "_diffusers_version" && folder_scheduler.contains(key) &&
            folder_scheduler[key] != value)
          same_scheduler = false;
    if (!same_scheduler || p.value("max_sequence_length", 128) != 128) continue;
    verify::CaseTensors t(c);
    const bool editing = t.has("image_uint8");
    const double refine = p.value("refine_strength", 0.0);
    const auto lora = set.index.value("e1_weights", nlohmann::json::object());
    if (editing && refine > 0 && !lora.contains("lora_file")) continue;
    if (!editing && p.value("default_sample_size", 0) * p.value("vae_scale_factor", 8) !=
                        max_resolution[0].get<int>() * 8)
      continue;
    test::TempDir dir;
    // The case file holds the latents as "latents" and the noise as noise.0, noise.1, ...
    std::vector<std::string> args = {
        editing ? "edit" : "txt2img",
        "-m",
        model,
        "-p",
        p["prompt"].is_array() ? p["prompt"][0].get<std::string>() : p["prompt"].get<std::string>(),
        "--steps",
        std::to_string(p.value("num_inference_steps", 50)),
        "--cfg-scale",
        c10::str(p.value("guidance_scale", 5.0)),
        "--latents",
        c.file,
        "--device",
        "cpu",
        "--dtype",
        "fp32",
        "--quiet",
        "-o",
        dir.file("out.png")};
    if (p.contains("negative_prompt")) {
      const auto& n = p["negative_prompt"];
      args.insert(args.end(),
                  {"-n", n.is_array() ? n[0].get<std::string>() : n.get<std::string>()});
    }
    if (t.has("noise.0")) args.insert(args.end(), {"--step-noise", c.file});
    if (editing) {
      const auto src = t.get("image_uint8").contiguous();
      Image image;
      image.height = static_cast<int>(src.size(0));
      image.width = static_cast<int>(src.size(1));
      image.rgb.assign(src.data_ptr<uint8_t>(), src.data_ptr<uint8_t>() + src.numel());
      write_png(dir.file("source.png"), image);
      args.insert(args.end(),
                  {"-i", dir.file("source.png"), "--image-guidance",
                   c10::str(p.value("image_guidance_scale", 4.0)), "--refine", c10::str(refine)});
      if (!p.value("clip_cfg_norm", true)) args.push_back("--no-clip-cfg-norm");
      if (refine > 0) {
        args.insert(args.end(), {"--e1-lora", set.path_inside(lora["lora_file"].get<std::string>(),
                                                              "e1_weights.lora_file")});
        if (lora.contains("lora_alpha"))
          args.insert(args.end(), {"--lora-alpha", c10::str(lora["lora_alpha"].get<double>())});
        if (lora.contains("lora_rank"))
          args.insert(args.end(), {"--lora-rank", c10::str(lora["lora_rank"].get<double>())});
      } else {
        args.insert(args.end(), {"--transformer", "transformer_e1"});
      }
    } else {
      args.insert(args.end(), {"-W", std::to_string(p.value("width", 0)), "-H",
                               std::to_string(p.value("height", 0))});
    }
    auto r = run_cli(args, dir);
    ASSERT_EQ(r.exit_code, 0) << c.name << ": " << r.err;
    const auto expected = t.get("image")[0].to(torch::kFloat64);  // [H, W, 3] in [0, 1]
    auto img = read_png(dir.file("out.png"));
    ASSERT_EQ(img.height, expected.size(0)) << c.name;
    ASSERT_EQ(img.width, expected.size(1)) << c.name;
    auto got = torch::from_blob(img.rgb.data(), {img.height, img.width, 3}, torch::kUInt8)
                   .to(torch::kFloat64) /
               255.0;
    EXPECT_LE((got - expected).abs().max().item<double>(), 0.5 / 255.0 + c.tol("atol", 1e-4) + 1e-9)
        << c.name;
    std::cout << c.name << ": the CLI's image matches\n";
    ++ran;
  }
  if (ran == 0) GTEST_SKIP() << "no HiDream pipeline case the CLI can state in this golden set";
}

TEST(Cli, HiDreamTxt2ImgAndEditWriteOnePng) {
  const std::string hidream = test::hidream_golden_dir();
  if (!std::filesystem::exists(hidream + "/cases.json")) GTEST_SKIP() << "no set at " << hidream;
  const std::string model = verify::GoldenSet::load(hidream).model_dir();
  test::TempDir dir;
  auto t2i = run_cli({"txt2img", "-m", model, "-p", "a red fox", "-n", "blurry", "--steps", "2",
                      "--cfg-scale", "5", "--seed", "3", "--quiet", "-o", dir.file("fox.png")},
                     dir);
  ASSERT_EQ(t2i.exit_code, 0) << t2i.err;
  auto fox = read_png(dir.file("fox.png"));
  // The I1 pipeline rescales any size to the model's area (max_resolution x 8 pixels a side).
  EXPECT_EQ(fox.width * fox.height, 128 * 128);
  auto edit = run_cli({"edit", "-m", model, "--transformer", "transformer_e1", "-i",
                       dir.file("fox.png"), "-p", "make it blue", "--steps", "2", "--seed", "3",
                       "--quiet", "--device", "cpu", "-o", dir.file("blue.png")},
                      dir);
  ASSERT_EQ(edit.exit_code, 0) << edit.err;
  EXPECT_EQ(read_png(dir.file("blue.png")).width, fox.width);
  // E1-Full: I1 weights + the LoRA file, with a refine phase.
  auto refine = run_cli({"edit",
                         "-m",
                         model,
                         "--e1-lora",
                         model + "/e1_lora.safetensors",
                         "--lora-alpha",
                         "4",
                         "--lora-rank",
                         "4",
                         "-i",
                         dir.file("fox.png"),
                         "-p",
                         "Editing Instruction: make it blue. Target Image Description: a blue fox.",
                         "--refine",
                         "0.5",
                         "--steps",
                         "2",
                         "--seed",
                         "3",
                         "--quiet",
                         "-o",
                         dir.file("refined.png")},
                        dir);
  ASSERT_EQ(refine.exit_code, 0) << refine.err;
  EXPECT_TRUE(std::filesystem::exists(dir.file("refined.png")));
  // Stage devices: the same image with the text encoders and the VAE named explicitly.
  auto placed = run_cli({"edit",
                         "-m",
                         model,
                         "--transformer",
                         "transformer_e1",
                         "-i",
                         dir.file("fox.png"),
                         "-p",
                         "make it blue",
                         "--steps",
                         "2",
                         "--seed",
                         "3",
                         "--quiet",
                         "--device",
                         "cpu",
                         "--text-encoder-device",
                         "cpu",
                         "--vae-device",
                         "cpu",
                         "-o",
                         dir.file("placed.png")},
                        dir);
  ASSERT_EQ(placed.exit_code, 0) << placed.err;
  EXPECT_EQ(read_png(dir.file("placed.png")).rgb, read_png(dir.file("blue.png")).rgb);
  // Two tensors, neither named latents nor noise.0: not what --latents / --step-noise take.
  io::save_safetensors(dir.file("other.safetensors"),
                       {{"a", torch::zeros({1, 2})}, {"b", torch::zeros({3})}});
  for (const auto& bad : std::vector<std::vector<std::string>>{
           {"-i", dir.file("fox.png"), "--refine", "1.5"},
           {"-i", dir.file("missing.png")},
           {"-i", dir.file("fox.png"), "--latents", dir.file("other.safetensors")},
           {"-i", dir.file("fox.png"), "--step-noise", dir.file("other.safetensors")},
           {"-i", dir.file("fox.png"), "--text-encoder-device", "tpu"},
           {"-i", dir.file("fox.png"), "--vae-device", "cuda:9"}}) {
    std::vector<std::string> args = {
        "edit", "-m", model, "-p", "x", "--steps", "1", "-o", dir.file("bad.png")};
    args.insert(args.end(), bad.begin(), bad.end());
    auto r = run_cli(args, dir);
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.err.find("error: "), std::string::npos) << r.err;
    EXPECT_FALSE(std::filesystem::exists(dir.file("bad.png")));
  }
  // An I1 folder without E1 weights does not edit: refused, naming what would.
  auto plain = run_cli({"edit", "-m", model, "-i", dir.file("fox.png"), "-p", "make it blue",
                        "--steps", "1", "-o", dir.file("plain.png")},
                       dir);
  EXPECT_NE(plain.exit_code, 0);
  EXPECT_NE(plain.err.find("HiDream-I1 folder"), std::string::npos) << plain.err;
  EXPECT_NE(plain.err.find("--e1-lora"), std::string::npos) << plain.err;
  EXPECT_FALSE(std::filesystem::exists(dir.file("plain.png")));
  // A folder missing one of the four text encoders is refused before anything loads.
  const auto partial = dir.path() / "partial";
  std::filesystem::copy(model, partial, std::filesystem::copy_options::recursive);
  std::filesystem::remove_all(partial / "text_encoder_3");
  auto r = run_cli(
      {"txt2img", "-m", partial.string(), "-p", "x", "--steps", "1", "-o", dir.file("partial.png")},
      dir);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("has no text_encoder_3/"), std::string::npos) << r.err;
  EXPECT_FALSE(std::filesystem::exists(dir.file("partial.png")));
}

// doctor reports the threads a generation will use (the pipelines' policy), not LibTorch's
// default before it is applied.
TEST(Cli, VaeTilingFlags) {
  test::TempDir dir;
  const std::string demo = std::string(DIFFUSE_SOURCE_DIR) + "/models/demo";
  // On: a 256x256 image in the demo VAE's 128 px tiles, written like any other.
  auto tiled =
      run_cli({"txt2img", "-m", demo, "-p", "a red circle", "-W", "256", "-H", "256", "--steps",
               "2", "--seed", "1", "--vae-tiling", "on", "--quiet", "-o", dir.file("tiled.png")},
              dir);
  ASSERT_EQ(tiled.exit_code, 0) << tiled.err;
  EXPECT_EQ(read_png(dir.file("tiled.png")).width, 256);
  // A mode that does not exist is a usage error naming the flag.
  auto bad_mode = run_cli({"txt2img", "-m", demo, "-p", "x", "--vae-tiling", "sometimes", "--quiet",
                           "-o", dir.file("no.png")},
                          dir);
  EXPECT_EQ(bad_mode.exit_code, 2) << bad_mode.err;
  EXPECT_NE(bad_mode.err.find("--vae-tiling"), std::string::npos) << bad_mode.err;
  // A tile that is no multiple of the VAE's 8 pixels: refused, naming it, no output file.
  auto bad_tile =
      run_cli({"txt2img", "-m", demo, "-p", "x", "-W", "256", "-H", "256", "--steps", "1",
               "--vae-tiling", "on", "--vae-tile-size", "100", "--quiet", "-o", dir.file("no.png")},
              dir);
  EXPECT_NE(bad_tile.exit_code, 0);
  EXPECT_NE(bad_tile.err.find("tile size 100"), std::string::npos) << bad_tile.err;
  EXPECT_FALSE(std::filesystem::exists(dir.file("no.png")));
}

TEST(Cli, DoctorReportsTheThreadsAGenerationUses) {
  test::TempDir dir;
  ::setenv("DIFFUSE_THREADS", "3", 1);
  auto r = run_cli({"doctor", "--json"}, dir);
  ::unsetenv("DIFFUSE_THREADS");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out)["threads"]["intra_op"], 3) << r.out;
}

// Bad input: exit code non-zero, one line on stderr saying what is wrong, no output file.
TEST(Cli, BadInputGivesOneClearLineAndNoOutput) {
  test::TempDir dir;
  auto set = verify::GoldenSet::load(test::golden_dir());
  std::string model = set.model_dir();
  {
    std::ofstream f(dir.file("notpng.png"));
    f << "hello";
  }
  struct Case {
    std::vector<std::string> args;
    std::string needle;
  };
  std::vector<Case> cases = {
      {{"txt2img", "-m", dir.file("missing-model"), "-p", "x"}, "does not exist"},
      {{"txt2img", "-m", model, "-p", "x", "-W", "100"}, "multiples of 8"},
      {{"txt2img", "-m", model, "-p", "x", "--steps", "0"}, "steps"},
      {{"txt2img", "-m", model, "-p", "x", "--scheduler", "warp"}, "unknown scheduler 'warp'"},
      {{"txt2img", "-m", model, "-p", "x", "--device", "tpu"}, "unknown device 'tpu'"},
      {{"txt2img", "-m", model, "-p", "x", "--dtype", "int4"}, "unknown dtype"},
      {{"txt2img", "-m", model, "-p", "x", "--latents", dir.file("none.safetensors")},
       "cannot open"},
      {{"img2img", "-m", model, "-p", "x", "-i", dir.file("notpng.png")}, "not a PNG"},
      {{"img2img", "-m", model, "-p", "x", "-i", dir.file("missing.png")}, "cannot open image"},
      {{"img2img", "-m", model, "-p", "x", "-i", dir.file("notpng.png"), "--strength", "1.5"},
       "strength"},
      {{"txt2img", "-m", model, "-p", "x", "-o", dir.file("no/such/dir/out.png")},
       "does not exist"},
      {{"verify", "--golden", dir.file("nothing")}, "cases.json"},
      {{"create-demo-model", "--arch", "sd9", "--out", dir.file("model")}, "sd2.1-base"},
      {{"train-demo", "--out", dir.path().string(), "--minutes", "1"}, "--force"},
      {{"train-demo", "--out", dir.file("m"), "--precision", "fp8"}, "--precision"},
      {{"txt2img", "-m", model, "-p", "x", "--seed", "18446744073709551616"}, "2^64 - 1"},
      {{"txt2img", "-m", model, "-p", "x", "--seed", "-1"}, "expected an integer in [0,"},
      {{"txt2img", "-m", model, "-p", "x", "--device", ""}, "empty value is not allowed"},
      {{"txt2img", "-m", model, "-p", "x", "-W", "0"}, "a width in pixels"},
      {{"txt2img", "-m", model, "-p", "x", "--num-images", "1000000"}, "images per prompt"},
      {{"bench", "-W", "100000"}, "a width in pixels"},
      {{"train-demo", "--out", dir.file("m"), "--arch", "flux"}, "--arch"},
      {{"train-demo", "--out", dir.file("m"), "--vae-batch", "100000000"}, "--vae-batch 1024"},
      {{"train-demo", "--out", dir.file("m"), "--seed", "-1"}, "--seed"},
      {{"serve", "-m", model, "--port", "65536"}, "a TCP port"},
      {{"serve", "-m", model, "--queue", "-1"}, "a queue length"},
      {{"serve", "-m", model, "--max-steps", "0"}, "a number of steps"},
      {{"serve", "-m", model, "--max-side", "0"}, "an image side in pixels"},
      {{"serve", "-m", model, "--max-images", "-1"}, "a number of images"},
      {{"serve", "-m", model, "--api-key", " "}, "only whitespace"},
      {{"serve", "-m", model, "--lora-dir", dir.file("no-such-dir")}, "--lora-dir"},
      {{"txt2img", "-m", model, "-p", "x", "--devices", "cpu,cpu", "--parallel-timeout", "nan"},
       "seconds: a number in [1, 86400]"},
      {{"txt2img", "-m", model, "-p", "x", "--vae-tile-overlap", "nan"}, "a fraction of the tile"},
      {{"txt2img", "-m", model, "-p", "x", "--cache", "fbcache"}, "UNet"},
      {{"txt2img", "-m", model, "-p", "x", "--lora", dir.file("notpng.png") + ":abc"},
       "the scale 'abc' after the last ':' is not a number"},
      {{"txt2img", "-m", model, "-p", "x", "--cache", "fbcache:7"}, "--cache fbcache:7"},
      {{"txt2img", "-m", model, "-p", "x", "--area-side", "512"}, "--area-side: HiDream's"},
      {{"txt2img", "-m", model, "-p", "x", "--max-memory", "12X"}, "--max-memory '12X'"},
      {{"create-demo-model", "--arch", "flux-dev", "--weights", "q5_1", "--out", dir.file("m2")},
       "expected bf16, fp16 or q8_0"},
      {{"doctor", "--no-smoke-test", "-m", dir.file("missing-model")}, "does not exist"},
  };
  for (const auto& c : cases) {
    auto args = c.args;
    if (std::find(args.begin(), args.end(), "-o") == args.end() && args[0] != "verify" &&
        args[0] != "create-demo-model" && args[0] != "train-demo" && args[0] != "bench" &&
        args[0] != "serve" && args[0] != "doctor")
      args.insert(args.end(), {"-o", dir.file("out.png")});
    auto r = run_cli(args, dir);
    EXPECT_NE(r.exit_code, 0) << c.needle;
    EXPECT_NE(r.err.find(c.needle), std::string::npos) << "stderr: " << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << "stderr: " << r.err;
    EXPECT_FALSE(std::filesystem::exists(dir.file("out.png"))) << c.needle;
  }
  // Nothing but the files the test made (no temporary PNG left behind).
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) {
    auto name = e.path().filename().string();
    EXPECT_TRUE(name == "notpng.png" || name == "stderr.txt") << name;
  }
}

TEST(Cli, RefusesOutputsThatAreNotNewOrRegularPngFiles) {
  test::TempDir dir;
  const auto model = test::golden_model_dir();
  std::filesystem::create_directory(dir.path() / "folder.png");
  ASSERT_EQ(::mkfifo(dir.file("fifo.png").c_str(), 0600), 0);
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"", "empty"},
      {dir.file("folder.png"), "is a directory"},
      {dir.file("fifo.png"), "is a named pipe"},
      {dir.file("out.jpg"), "only PNG output"},
      {dir.file("missing/out.png"), "does not exist"},
  };
  for (const auto& [out, needle] : cases) {
    auto r = run_cli({"txt2img", "-m", model, "-p", "x", "--steps", "1", "-o", out}, dir);
    EXPECT_NE(r.exit_code, 0) << out;
    EXPECT_NE(r.err.find(needle), std::string::npos) << out << " -> " << r.err;
  }
  EXPECT_TRUE(std::filesystem::is_directory(dir.path() / "folder.png"));
  EXPECT_TRUE(std::filesystem::is_fifo(dir.path() / "fifo.png"));
  EXPECT_FALSE(std::filesystem::exists(dir.file("out.jpg")));
}

TEST(Cli, FullSeedRangeIsKeptAndNoiseIsOnlyAnImg2ImgFlag) {
  test::TempDir dir;
  const std::string model = verify::GoldenSet::load(test::golden_dir()).model_dir();
  auto r = run_cli({"txt2img", "-m", model, "-p", "x", "--steps", "1", "-q", "--seed",
                    "18446744073709551615", "-o", dir.file("max.png")},
                   dir);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto text = read_png_text(dir.file("max.png"));
  EXPECT_NE(text["parameters"].find("Seed: 18446744073709551615"), std::string::npos)
      << text["parameters"];
  // txt2img has no use for --noise: refused, not read and ignored.
  auto n = run_cli({"txt2img", "-m", model, "-p", "x", "--noise", dir.file("n.safetensors"), "-o",
                    dir.file("n.png")},
                   dir);
  EXPECT_NE(n.exit_code, 0);
  EXPECT_NE(n.err.find("--noise"), std::string::npos) << n.err;
}

struct SignalledRun {
  bool signalled = false;
  int status = 0;
  std::string err;
};

// Runs the CLI with `args`, sends `sig` once `trigger` appears on its stderr, and waits for it.
SignalledRun run_and_signal(const std::vector<std::string>& args, const std::string& trigger,
                            int sig,
                            const std::function<void(const std::string&)>& before_signal = {},
                            bool default_threads = false) {
  SignalledRun r;
  int err_pipe[2];
  if (::pipe(err_pipe) != 0) return r;
  std::vector<char*> argv;
  std::string path = DIFFUSE_CLI_PATH;
  argv.push_back(path.data());
  std::vector<std::string> copy = args;
  for (auto& a : copy) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) return r;
  if (pid == 0) {
    ::dup2(err_pipe[1], STDERR_FILENO);
    ::close(err_pipe[0]);
    ::close(err_pipe[1]);
    // As a user runs it: OpenMP and LibTorch start their threads as they do by default.
    if (default_threads) ::unsetenv("OMP_NUM_THREADS");
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  ::close(err_pipe[1]);
  char buf[4096];
  for (ssize_t n; (n = ::read(err_pipe[0], buf, sizeof buf)) > 0;) {
    r.err.append(buf, static_cast<size_t>(n));
    if (!r.signalled && r.err.find(trigger) != std::string::npos) {
      if (before_signal) before_signal(r.err);
      ::kill(pid, sig);
      r.signalled = true;
    }
  }
  ::close(err_pipe[0]);
  ::waitpid(pid, &r.status, 0);
  return r;
}

// SIGINT/SIGTERM while generating: "interrupted", exit 128 + signal, no output file.
TEST(Cli, InterruptPrintsInterruptedAndExitsWith128PlusTheSignal) {
  const std::string model = std::string(DIFFUSE_SOURCE_DIR) + "/models/demo";
  for (int sig : {SIGINT, SIGTERM}) {
    SCOPED_TRACE(sig);
    test::TempDir dir;
    const std::string out = dir.file("out.png");
    // Once the denoising loop runs.
    auto r = run_and_signal(
        {"txt2img", "-m", model, "-p", "a red circle", "--steps", "900", "-o", out}, "step ", sig);
    ASSERT_TRUE(r.signalled) << r.err;
    ASSERT_TRUE(WIFEXITED(r.status)) << r.err;
    EXPECT_EQ(WEXITSTATUS(r.status), 128 + sig);
    EXPECT_NE(r.err.find("interrupted"), std::string::npos) << r.err;
    EXPECT_FALSE(std::filesystem::exists(out));
  }
}

// train-demo too: 128 + signal, and neither the model folder nor its staging folder is left.
TEST(Cli, TrainDemoInterruptExitsWith128PlusTheSignalAndLeavesNoFolder) {
  for (int sig : {SIGINT, SIGTERM}) {
    SCOPED_TRACE(sig);
    test::TempDir dir;
    const std::string out = dir.file("model");
    auto r = run_and_signal(
        {"train-demo", "--out", out, "--resolution", "32", "--vae-crop", "16", "--vae-batch", "2",
         "--vae-steps", "2000", "--unet-steps", "1", "--dataset", "4"},
        "[vae] step ", sig);
    ASSERT_TRUE(r.signalled) << r.err;
    ASSERT_TRUE(WIFEXITED(r.status)) << r.err;
    EXPECT_EQ(WEXITSTATUS(r.status), 128 + sig) << r.err;
    EXPECT_NE(r.err.find("interrupted"), std::string::npos) << r.err;
    EXPECT_TRUE(std::filesystem::is_empty(dir.path())) << r.err;
  }
}

// `serve` stops cleanly on either signal, whichever of its threads the kernel hands it to
// (libraries start threads before main that do not block signals): exit 0, "stopped".
TEST(Cli, ServeStopsCleanlyOnSigintAndSigterm) {
  const std::string model = std::string(DIFFUSE_SOURCE_DIR) + "/models/demo";
  for (int round = 0; round < 3; ++round)
    for (int sig : {SIGINT, SIGTERM}) {
      SCOPED_TRACE(sig);
      // Signalled after one request has been served, as a user would.
      auto r = run_and_signal(
          {"serve", "-m", model, "--port", "0", "--device", "cpu"}, "/\n", sig,
          [](const std::string& err) {
            const auto at = err.find("http://127.0.0.1:");
            ASSERT_NE(at, std::string::npos) << err;
            const int port = std::atoi(err.c_str() + at + 17);
            httplib::Client c("127.0.0.1", port);
            auto res = c.Get("/v1/status");
            EXPECT_TRUE(res && res->status == 200);
          },
          /*default_threads=*/true);
      ASSERT_TRUE(r.signalled) << r.err;
      ASSERT_TRUE(WIFEXITED(r.status)) << r.err;
      EXPECT_EQ(WEXITSTATUS(r.status), 0) << r.err;
      EXPECT_NE(r.err.find("diffuse serve: stopped"), std::string::npos) << r.err;
    }
}

TEST(Cli, VerifyJsonReportsEveryCase) {
  test::TempDir dir;
  auto set = verify::GoldenSet::load(test::golden_dir());
  auto r = run_cli({"verify", "--golden", test::golden_dir(), "--component", "tokenizer",
                    "--component", "scheduler", "--json"},
                   dir);
  auto j = nlohmann::json::parse(r.out);
  int expected = 0;
  for (const auto& c : set.cases)
    expected += c.component == "tokenizer" || c.component == "scheduler";
  EXPECT_EQ(static_cast<int>(j["cases"].size()), expected);
  EXPECT_EQ(j["passed"].get<int>() + j["failed"].get<int>(), expected);
  EXPECT_EQ(r.exit_code, j["failed"].get<int>() == 0 ? 0 : 1);
  for (const auto& c : j["cases"])
    for (const char* k : {"name", "component", "passed", "max_abs_err", "reason"})
      EXPECT_TRUE(c.contains(k)) << k;
}

}  // namespace test_cli
}  // namespace diffuse
