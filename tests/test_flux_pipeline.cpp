// FLUX.1 (dev, schnell) and FLUX.1 Kontext: every case of the flux-tiny and flux-kontext-tiny
// golden sets (transformer, schedulers with FLUX's sigmas, encoders, VAE, pipelines) through
// the verify code with every recorded tensor compared; latent packing; Pillow's Lanczos; bad
// inputs; and the CLI on both folders.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <array>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <random>

#include "accel/dit_cache.h"
#include "adapters/lora.h"
#include "cli_run.h"
#include "diffuse/errors.h"
#include "diffuse/image.h"
#include "golden_case_check.h"
#include "io/gguf.h"
#include "io/model_folder.h"
#include "io/pillow_resample.h"
#include "io/safetensors.h"
#include "models/clip_text_model.h"
#include "models/flux_bfl_names.h"
#include "models/flux_transformer.h"
#include "pipeline/flux.h"
#include "test_util.h"
#include "verify/verify.h"

namespace diffuse {
namespace test_flux_pipeline {

namespace fs = std::filesystem;

bool have(const std::string& dir) {
  return fs::exists(dir + "/cases.json");
}

// Every case passes, and every output the reference recorded for a pipeline or transformer
// case was compared (ids, embeddings, position ids, each step's transformer input/output and
// latents, the image; not only the final image).
void expect_set_passes(const std::string& dir) {
  test::expect_golden_set_passes(dir, {"pipeline", "transformer"});
}

TEST(FluxGolden, EveryFluxCasePasses) {
  if (!have(test::flux_golden_dir())) GTEST_SKIP() << "no set at " << test::flux_golden_dir();
  expect_set_passes(test::flux_golden_dir());
}

TEST(FluxGolden, EveryKontextCasePasses) {
  const auto dir = test::flux_kontext_golden_dir();
  if (!have(dir)) GTEST_SKIP() << "no set at " << dir;
  expect_set_passes(dir);
}

TEST(FluxLatents, PackingIsTheReferenceLayoutAndUnpackInvertsIt) {
  auto latents = torch::randn({2, 16, 6, 10});
  auto tokens = models::flux_pack(latents);
  ASSERT_EQ(tokens.sizes(), (std::vector<int64_t>{2, 15, 64}));
  // Token (row 1, col 2), feature (c 3, py 1, px 0) is latent pixel (2*1+1, 2*2+0) of channel 3.
  EXPECT_EQ(tokens[1][1 * 5 + 2][3 * 4 + 1 * 2 + 0].item<float>(),
            latents[1][3][3][4].item<float>());
  EXPECT_TRUE(torch::equal(models::flux_unpack(tokens, 6, 10), latents));
  auto ids = models::flux_image_ids(6, 10, 1.0f);
  ASSERT_EQ(ids.sizes(), (std::vector<int64_t>{15, 3}));
  EXPECT_EQ(ids[7][0].item<float>(), 1.0f);
  EXPECT_EQ(ids[7][1].item<float>(), 1.0f);
  EXPECT_EQ(ids[7][2].item<float>(), 2.0f);
  EXPECT_THROW(models::flux_pack(torch::zeros({1, 16, 5, 4})), InvalidArgument);
  EXPECT_THROW(models::flux_unpack(tokens, 6, 12), InvalidArgument);
}

// The Kontext set's autoresize case stores the source as the reference resized it (Pillow,
// Lanczos, 40x72 -> 720x1456): the same bytes.
TEST(PillowLanczos, GivesPillowsBytes) {
  const auto dir = test::flux_kontext_golden_dir();
  if (!have(dir)) GTEST_SKIP() << "no set at " << dir;
  const auto set = verify::GoldenSet::load(dir);
  int checked = 0;
  for (const auto& c : set.cases) {
    verify::CaseTensors t(c);
    if (!t.has("image_uint8") || !t.has("image_resized_uint8")) continue;
    const auto want = t.get("image_resized_uint8");
    const auto got = io::pillow_lanczos_resize(t.get("image_uint8"), want.size(0), want.size(1));
    EXPECT_TRUE(torch::equal(got, want))
        << c.name << ": "
        << (got.to(torch::kInt32) - want.to(torch::kInt32)).abs().max().item<int>()
        << " max difference, " << (got != want).sum().item<int64_t>() << " bytes differ";
    ++checked;
  }
  EXPECT_GT(checked, 0);
}

// Against Pillow itself (Debian's python3-pil through /usr/bin/python3) on random images and
// sizes: down- and upscaling, tall and wide, one side only, the Kontext autoresize shapes.
TEST(PillowLanczos, GivesPillowsBytesOnRandomSizes) {
  const std::string python = "/usr/bin/python3";
  ASSERT_EQ(std::system((python + " -c 'import PIL' 2>/dev/null").c_str()), 0)
      << python << " cannot import PIL (scripts/setup.sh installs python3-pil)";
  test::TempDir dir;
  std::vector<std::array<int64_t, 4>> sizes = {{72, 40, 1456, 720},
                                               {40, 72, 720, 1456},
                                               {48, 64, 48, 80},
                                               {33, 17, 33, 5},
                                               {9, 200, 300, 9}};
  std::mt19937 rng(20261206);
  const auto side = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  for (int i = 0; i < 24; ++i)
    sizes.push_back({side(1, 160), side(1, 160), side(1, 400), side(1, 400)});
  torch::manual_seed(7);
  std::ofstream list(dir.file("list.txt"));
  std::vector<torch::Tensor> images;
  for (size_t i = 0; i < sizes.size(); ++i) {
    const auto [h, w, oh, ow] = sizes[i];
    images.push_back(torch::randint(0, 256, {h, w, 3}).to(torch::kUInt8));
    const auto in = dir.file("in" + std::to_string(i) + ".raw");
    std::ofstream(in, std::ios::binary)
        .write(static_cast<const char*>(images.back().data_ptr()), images.back().numel());
    list << in << " " << h << " " << w << " " << dir.file("out" + std::to_string(i) + ".raw") << " "
         << oh << " " << ow << "\n";
  }
  list.close();
  const std::string script = std::string(DIFFUSE_SOURCE_DIR) + "/tests/tools/pillow_resize.py";
  ASSERT_EQ(std::system((python + " '" + script + "' '" + dir.file("list.txt") + "'").c_str()), 0);
  for (size_t i = 0; i < sizes.size(); ++i) {
    const auto [h, w, oh, ow] = sizes[i];
    const auto bytes = test::read_file(dir.file("out" + std::to_string(i) + ".raw"));
    ASSERT_EQ(static_cast<int64_t>(bytes.size()), oh * ow * 3);
    const auto want = torch::from_blob(const_cast<char*>(bytes.data()), {oh, ow, 3}, torch::kUInt8);
    const auto got = io::pillow_lanczos_resize(images[i], oh, ow);
    EXPECT_TRUE(torch::equal(got, want)) << h << "x" << w << " -> " << oh << "x" << ow << ": "
                                         << (got != want).sum().item<int64_t>() << " bytes differ";
  }
}

TEST(PillowLanczos, KeepsConstantsAndSizesAndRefusesBadImages) {
  auto grey = torch::full({5, 7, 3}, 77, torch::kUInt8);
  for (auto [h, w] : {std::pair<int64_t, int64_t>{5, 7}, {11, 3}, {2, 19}, {40, 40}}) {
    auto out = io::pillow_lanczos_resize(grey, h, w);
    ASSERT_EQ(out.sizes(), (std::vector<int64_t>{h, w, 3}));
    // Weights sum to one in fixed point: a flat image stays flat (to the rounding of 22 bits).
    EXPECT_EQ(out.min().item<int>(), 77);
    EXPECT_EQ(out.max().item<int>(), 77);
  }
  auto ramp = torch::arange(0, 250, 10, torch::kInt64).to(torch::kUInt8).view({1, 25, 1});
  auto half = io::pillow_lanczos_resize(ramp, 1, 5);
  // Monotone input, monotone output within the ramp's range.
  for (int i = 1; i < 5; ++i) EXPECT_GE(half[0][i][0].item<int>(), half[0][i - 1][0].item<int>());
  EXPECT_THROW(io::pillow_lanczos_resize(torch::zeros({4, 4, 3}), 2, 2), InvalidArgument);
  EXPECT_THROW(io::pillow_lanczos_resize(grey, 0, 4), InvalidArgument);
  EXPECT_THROW(io::pillow_lanczos_resize(grey.view({35, 3}), 2, 2), InvalidArgument);
}

TEST(FluxTransformer, RefusesMalformedInputsWithTheExpectedShape) {
  const auto dir = test::flux_golden_dir();
  if (!have(dir)) GTEST_SKIP() << "no set at " << dir;
  const auto folder = io::ModelFolder::open(dir + "/model");
  auto dev = models::load_flux_transformer(folder, torch::kCPU, torch::kFloat32, "transformer");
  auto schnell =
      models::load_flux_transformer(folder, torch::kCPU, torch::kFloat32, "transformer_schnell");
  const auto& c = dev->config();
  auto x = torch::randn({1, 4, c.in_channels});
  auto enc = torch::randn({1, 3, c.joint_attention_dim});
  auto pooled = torch::randn({1, c.pooled_projection_dim});
  auto img_ids = models::flux_image_ids(4, 4);
  auto txt_ids = torch::zeros({3, 3});
  auto t = torch::full({1}, 0.5f), g = torch::full({1}, 3.5f);
  torch::InferenceMode guard;
  EXPECT_EQ(dev->forward(x, t, enc, pooled, img_ids, txt_ids, g).sizes(), x.sizes());
  const auto message = [](auto f) { return test::expect_throw<InvalidArgument>(f); };
  EXPECT_NE(message([&] { dev->forward(x, t, enc, pooled, img_ids, txt_ids); }).find("guidance"),
            std::string::npos);
  EXPECT_NE(message([&] {
              schnell->forward(x, t, enc, pooled, img_ids, txt_ids, g);
            }).find("no guidance embedding"),
            std::string::npos);
  EXPECT_NE(message([&] {
              dev->forward(x.narrow(2, 0, 8), t, enc, pooled, img_ids, txt_ids, g);
            }).find("hidden_states"),
            std::string::npos);
  EXPECT_NE(message([&] {
              dev->forward(x, t, enc, pooled, models::flux_image_ids(2, 4), txt_ids, g);
            }).find("img_ids"),
            std::string::npos);
  EXPECT_NE(message([&] {
              dev->forward(x, t, enc.narrow(2, 0, 4), pooled, img_ids, txt_ids, g);
            }).find("encoder_hidden_states"),
            std::string::npos);
}

// The tiny model's diffusers weights written in BFL's original layout (as flux1-dev.safetensors
// and city96's GGUFs hold them): fused qkv / linear1, (shift, scale) in the final layer, RMSNorm
// ".scale", under ComfyUI's "model.diffusion_model." prefix.
std::vector<std::pair<std::string, torch::Tensor>> bfl_named(
    const std::map<std::string, torch::Tensor>& d, const models::FluxTransformerConfig& c) {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  const std::string p = "model.diffusion_model.";
  auto lin = [&](const std::string& bfl, const std::string& name) {
    out.emplace_back(p + bfl + ".weight", d.at(name + ".weight"));
    out.emplace_back(p + bfl + ".bias", d.at(name + ".bias"));
  };
  auto fused = [&](const std::string& bfl, const std::vector<std::string>& names) {
    for (const char* s : {".weight", ".bias"}) {
      std::vector<torch::Tensor> parts;
      for (const auto& n : names) parts.push_back(d.at(n + s));
      out.emplace_back(p + bfl + s, torch::cat(parts));
    }
  };
  auto norm = [&](const std::string& bfl, const std::string& name) {
    out.emplace_back(p + bfl + ".scale", d.at(name + ".weight"));
  };
  lin("img_in", "x_embedder");
  lin("txt_in", "context_embedder");
  lin("time_in.in_layer", "time_text_embed.timestep_embedder.linear_1");
  lin("time_in.out_layer", "time_text_embed.timestep_embedder.linear_2");
  lin("vector_in.in_layer", "time_text_embed.text_embedder.linear_1");
  lin("vector_in.out_layer", "time_text_embed.text_embedder.linear_2");
  if (c.guidance_embeds) {
    lin("guidance_in.in_layer", "time_text_embed.guidance_embedder.linear_1");
    lin("guidance_in.out_layer", "time_text_embed.guidance_embedder.linear_2");
  }
  lin("final_layer.linear", "proj_out");
  for (const char* s : {".weight", ".bias"}) {  // BFL: (shift, scale)
    const auto halves = d.at(std::string("norm_out.linear") + s).chunk(2);
    out.emplace_back(p + "final_layer.adaLN_modulation.1" + s, torch::cat({halves[1], halves[0]}));
  }
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const auto b = "double_blocks." + std::to_string(i) + ".";
    const auto m = "transformer_blocks." + std::to_string(i) + ".";
    lin(b + "img_mod.lin", m + "norm1.linear");
    lin(b + "txt_mod.lin", m + "norm1_context.linear");
    fused(b + "img_attn.qkv", {m + "attn.to_q", m + "attn.to_k", m + "attn.to_v"});
    fused(b + "txt_attn.qkv",
          {m + "attn.add_q_proj", m + "attn.add_k_proj", m + "attn.add_v_proj"});
    norm(b + "img_attn.norm.query_norm", m + "attn.norm_q");
    norm(b + "img_attn.norm.key_norm", m + "attn.norm_k");
    norm(b + "txt_attn.norm.query_norm", m + "attn.norm_added_q");
    norm(b + "txt_attn.norm.key_norm", m + "attn.norm_added_k");
    lin(b + "img_attn.proj", m + "attn.to_out.0");
    lin(b + "txt_attn.proj", m + "attn.to_add_out");
    lin(b + "img_mlp.0", m + "ff.net.0.proj");
    lin(b + "img_mlp.2", m + "ff.net.2");
    lin(b + "txt_mlp.0", m + "ff_context.net.0.proj");
    lin(b + "txt_mlp.2", m + "ff_context.net.2");
  }
  for (int64_t i = 0; i < c.num_single_layers; ++i) {
    const auto b = "single_blocks." + std::to_string(i) + ".";
    const auto m = "single_transformer_blocks." + std::to_string(i) + ".";
    lin(b + "modulation.lin", m + "norm.linear");
    fused(b + "linear1", {m + "attn.to_q", m + "attn.to_k", m + "attn.to_v", m + "proj_mlp"});
    norm(b + "norm.query_norm", m + "attn.norm_q");
    norm(b + "norm.key_norm", m + "attn.norm_k");
    lin(b + "linear2", m + "proj_out");
  }
  return out;
}

// Every parameter of two models equal, bit for bit.
void expect_same_parameters(torch::nn::Module& a, torch::nn::Module& b) {
  const auto pa = a.named_parameters(), pb = b.named_parameters();
  ASSERT_EQ(pa.size(), pb.size());
  for (const auto& item : pa) {
    const auto* other = pb.find(item.key());
    ASSERT_NE(other, nullptr) << item.key();
    EXPECT_TRUE(torch::equal(item.value(), *other)) << item.key();
  }
}

TEST(FluxTransformer, LoadsBflsOriginalNamesPlainAndAsAQuantizedGguf) {
  const auto dir = test::flux_golden_dir();
  if (!have(dir)) GTEST_SKIP() << "no set at " << dir;
  const std::string model = dir + "/model";
  auto folder = io::ModelFolder::open(model);
  auto reference = models::load_flux_transformer(folder, torch::kCPU, torch::kFloat32);
  const auto& cfg = reference->config();
  const auto bfl = bfl_named(folder.component_weights("transformer"), cfg);
  test::TempDir tmp;
  io::save_safetensors(tmp.file("flux1-tiny.safetensors"), bfl);

  // safetensors in BFL names: the same model, bit for bit.
  {
    auto f = io::ModelFolder::open(model);
    const auto component = io::use_transformer_weights(f, tmp.file("flux1-tiny.safetensors"));
    auto loaded = models::load_flux_transformer(f, torch::kCPU, torch::kFloat32, component);
    expect_same_parameters(*loaded, *reference);
  }
  // A GGUF in BFL names with the fused matrices in q8_0 (city96's layout): the fused rows split
  // into the layers' blocks, equal to quantizing the diffusers model at load.
  {
    std::vector<io::GgufTensorToWrite> tensors;
    for (const auto& [name, t] : bfl) {
      const bool matrix = t.dim() == 2 && t.size(1) % 32 == 0;
      tensors.push_back({name, t, matrix ? quant::GgmlType::Q8_0 : quant::GgmlType::F32});
    }
    io::write_gguf(tmp.file("flux1-tiny-Q8_0.gguf"), {{"general.architecture", "flux"}}, tensors);
    auto f = io::ModelFolder::open(model);
    const auto component = io::use_transformer_weights(f, tmp.file("flux1-tiny-Q8_0.gguf"));
    nn::QuantizedLayers from_gguf, at_load;
    auto loaded = models::load_flux_transformer(f, torch::kCPU, torch::kFloat32, component,
                                                std::nullopt, &from_gguf);
    auto quantized = models::load_flux_transformer(folder, torch::kCPU, torch::kFloat32,
                                                   "transformer", quant::GgmlType::Q8_0, &at_load);
    EXPECT_GT(from_gguf.layers, 0);
    EXPECT_EQ(from_gguf.layers, at_load.layers);
    EXPECT_EQ(from_gguf.quantized_bytes, at_load.quantized_bytes);
    for (const auto& item : quantized->named_modules()) {
      const auto* q = dynamic_cast<const nn::LinearImpl*>(item.value().get());
      if (!q || !q->quantized) continue;
      const auto* other = loaded->named_modules().find(item.key());
      ASSERT_NE(other, nullptr);
      const auto* l = dynamic_cast<const nn::LinearImpl*>(other->get());
      ASSERT_TRUE(l && l->quantized) << item.key();
      EXPECT_TRUE(torch::equal(l->quantized->blocks, q->quantized->blocks)) << item.key();
    }
  }
  // A fused tensor with rows missing is refused naming it.
  {
    auto cut = bfl;
    for (auto& [name, t] : cut)
      if (name.find("single_blocks.0.linear1.weight") != std::string::npos) t = t.narrow(0, 0, 8);
    io::save_safetensors(tmp.file("cut.safetensors"), cut);
    auto f = io::ModelFolder::open(model);
    const auto component = io::use_transformer_weights(f, tmp.file("cut.safetensors"));
    const auto msg = test::expect_throw<FormatError>(
        [&] { models::load_flux_transformer(f, torch::kCPU, torch::kFloat32, component); });
    EXPECT_NE(msg.find("single_blocks.0.linear1.weight"), std::string::npos) << msg;
  }
}

TEST(FluxPipeline, RefusesWhatItCannotRun) {
  const auto dir = test::flux_golden_dir();
  if (!have(dir)) GTEST_SKIP() << "no set at " << dir;
  pipeline::FluxPipeline pipe(io::ModelFolder::open(dir + "/model"), torch::kCPU, torch::kFloat32);
  EXPECT_FALSE(pipe.is_kontext());
  pipeline::FluxEdit e;
  e.image = torch::zeros({32, 32, 3}, torch::kUInt8);
  EXPECT_NE(test::expect_throw<InvalidArgument>([&] { pipe.edit(e); }).find("Kontext"),
            std::string::npos);
  pipeline::FluxTextToImage r;
  r.width = 8;
  EXPECT_THROW(pipe.text_to_image(r), InvalidArgument);
  r.width = 32;
  r.sampling.steps = 0;
  EXPECT_THROW(pipe.text_to_image(r), InvalidArgument);
  r.sampling.steps = 1;
  r.sampling.max_sequence_length = 513;
  EXPECT_THROW(pipe.text_to_image(r), InvalidArgument);
  r.sampling.max_sequence_length = 8;
  r.sampling.guidance_scale = std::nan("");
  EXPECT_THROW(pipe.text_to_image(r), InvalidArgument);
  // Sizes that are not multiples of 16 are floored, as the reference does, and said so.
  EXPECT_EQ(pipe.floored_size(70, 40), (std::pair<int, int>{64, 32}));
  // Kontext's source sizes: the closest training resolution by aspect (after flooring to 16).
  EXPECT_EQ(pipe.source_size(72, 40, true), (std::pair<int64_t, int64_t>{1456, 720}));
  EXPECT_EQ(pipe.source_size(72, 40, false), (std::pair<int64_t, int64_t>{64, 32}));
  EXPECT_EQ(pipe.source_size(500, 500, true), (std::pair<int64_t, int64_t>{1024, 1024}));
  EXPECT_THROW(pipe.source_size(15, 400, true), InvalidArgument);
}

TEST(FluxPipeline, ASeedGivesTheSameImageAndTrueCfgChangesIt) {
  const auto dir = test::flux_golden_dir();
  if (!have(dir)) GTEST_SKIP() << "no set at " << dir;
  pipeline::FluxPipeline pipe(io::ModelFolder::open(dir + "/model"), torch::kCPU, torch::kFloat32);
  pipeline::FluxTextToImage r;
  r.prompt = "a red boat";
  r.width = 48;
  r.height = 32;
  r.sampling.steps = 2;
  r.sampling.max_sequence_length = 16;
  r.sampling.seed = 11;
  const auto a = pipe.text_to_image(r);
  const auto b = pipe.text_to_image(r);
  ASSERT_EQ(a.image.sizes(), (std::vector<int64_t>{1, 32, 48, 3}));
  EXPECT_TRUE(torch::equal(a.image, b.image));
  r.negative_prompt = "blurry";
  EXPECT_TRUE(torch::equal(pipe.text_to_image(r).image, a.image));  // true_cfg_scale 1: unused
  r.sampling.true_cfg_scale = 2.0;
  const auto c = pipe.text_to_image(r);
  EXPECT_FALSE(torch::equal(c.image, a.image));
  EXPECT_TRUE(c.negative_embeddings.t5.defined());
}

// img2img: the steps the reference runs for a strength, a low strength stays near the image,
// and strengths outside (0, 1] are refused.
TEST(FluxPipeline, ImageToImageRunsTheReferencesStepsAndStaysNearTheImageAtLowStrength) {
  const auto dir = test::flux_golden_dir();
  if (!have(dir)) GTEST_SKIP() << "no set at " << dir;
  pipeline::FluxPipeline pipe(io::ModelFolder::open(dir + "/model"), torch::kCPU, torch::kFloat32);
  auto ramp = torch::linspace(0, 255, 48).view({1, 48, 1}).expand({32, 48, 3});
  pipeline::FluxImageToImage r;
  r.prompt = "a red boat";
  r.image = ramp.to(torch::kUInt8).contiguous();
  r.sampling.steps = 4;
  r.sampling.max_sequence_length = 8;
  r.sampling.seed = 5;
  const auto distance = [&](double strength) {
    r.strength = strength;
    const auto out = pipe.image_to_image(r);
    EXPECT_EQ(out.image.sizes(), (std::vector<int64_t>{1, 32, 48, 3}));
    // diffusers' get_timesteps: t_start = int(4 - 4 * strength).
    EXPECT_EQ(out.steps_run, 4 - static_cast<int>(4 - 4 * strength)) << strength;
    // In latent space: the decoder of a random tiny VAE does not give the image back.
    return (out.latents - out.image_latents).abs().mean().item<double>();
  };
  const double low = distance(0.3), full = distance(1.0);
  EXPECT_LT(low, full);
  r.strength = 0.0;
  EXPECT_THROW(pipe.image_to_image(r), InvalidArgument);
  r.strength = 1.5;
  EXPECT_THROW(pipe.image_to_image(r), InvalidArgument);
  r.strength = 0.05;  // int(4 - 0.2) = 3: the last step still runs, as in the reference
  EXPECT_EQ(pipe.image_to_image(r).steps_run, 1);
}

// The DiT caches run on FLUX through the same block loop as HiDream's: a TaylorSeer cache skips
// the blocks of some steps (and stays close to the full run), a block range outside the model is
// refused before anything runs.
TEST(FluxPipeline, DitCachesSkipBlocksAndRefuseRangesOutsideTheModel) {
  const auto dir = test::flux_golden_dir();
  if (!have(dir)) GTEST_SKIP() << "no set at " << dir;
  pipeline::FluxPipeline pipe(io::ModelFolder::open(dir + "/model"), torch::kCPU, torch::kFloat32);
  pipeline::FluxTextToImage r;
  r.prompt = "a red boat";
  r.width = r.height = 32;
  r.sampling.steps = 6;
  r.sampling.max_sequence_length = 8;
  r.negative_prompt = "blurry";
  r.sampling.true_cfg_scale = 1.5;  // both prompts in one call: the cache sees one call a step
  const auto full = pipe.text_to_image(r);
  EXPECT_EQ(full.cache.cached_calls, 0);
  r.sampling.cache = accel::parse_dit_cache("taylorseer:2:1");
  const auto cached = pipe.text_to_image(r);
  EXPECT_GT(cached.cache.cached_calls, 0);
  EXPECT_LT(cached.cache.blocks_run, cached.cache.blocks_possible);
  EXPECT_FALSE(torch::equal(cached.image, full.image));
  EXPECT_LT((cached.image - full.image).abs().mean().item<double>(), 0.25);
  const int64_t blocks =
      pipe.transformer_config().num_layers + pipe.transformer_config().num_single_layers;
  r.sampling.cache = accel::parse_dit_cache("ditcache:0:" + std::to_string(blocks + 3));
  EXPECT_THROW(pipe.text_to_image(r), InvalidArgument);
}

// A diffusers/peft LoRA on one attention projection changes the image; at scale 0 it does not;
// a file that names no module of the transformer is refused.
TEST(FluxPipeline, LorasMergeByTheirDiffusersNames) {
  const auto dir = test::flux_golden_dir();
  if (!have(dir)) GTEST_SKIP() << "no set at " << dir;
  test::TempDir tmp;
  const auto folder = io::ModelFolder::open(dir + "/model");
  const int64_t D = models::FluxTransformerConfig::from_json(
                        folder.component_config("transformer", "config.json"))
                        .inner_dim();
  const auto file = tmp.file("lora.safetensors");
  io::save_safetensors(
      file, {{"transformer.transformer_blocks.0.attn.to_q.lora_A.weight", torch::randn({2, D})},
             {"transformer.transformer_blocks.0.attn.to_q.lora_B.weight", torch::randn({D, 2})}});
  const auto stray = tmp.file("stray.safetensors");
  io::save_safetensors(stray, {{"transformer.nothing_here.lora_A.weight", torch::randn({2, D})},
                               {"transformer.nothing_here.lora_B.weight", torch::randn({D, 2})}});
  pipeline::FluxTextToImage r;
  r.prompt = "a red boat";
  r.width = r.height = 32;
  r.sampling.steps = 1;
  r.sampling.max_sequence_length = 8;
  const auto run = [&](const std::string& lora, double scale) {
    pipeline::FluxPipeline pipe(folder, torch::kCPU, torch::kFloat32);
    if (!lora.empty()) pipe.add_lora(lora, scale);
    return pipe.text_to_image(r).image;
  };
  const auto plain = run("", 0);
  EXPECT_TRUE(torch::equal(run(file, 0.0), plain));
  EXPECT_FALSE(torch::allclose(run(file, 1.0), plain));
  EXPECT_THROW(run(stray, 1.0), Error);
}

// kohya's lora_te1_* pairs patch CLIP-L (FLUX's first text encoder) by SD's names; the update is
// merged again when the encoders load again (the CLI frees them after each prompt), and a
// file resolves without the encoders loaded.
TEST(FluxPipeline, LorasReachClipLAndStayMergedWhenTheEncodersLoadAgain) {
  const auto dir = test::flux_golden_dir();
  if (!have(dir)) GTEST_SKIP() << "no set at " << dir;
  test::TempDir tmp;
  const auto folder = io::ModelFolder::open(dir + "/model");
  const auto cfg = models::clip_text_config(folder, "text_encoder");
  const int64_t H = cfg.hidden_size, r = 2;
  auto gen = at::detail::createCPUGenerator(9);
  const auto down = torch::randn({r, H}, gen), up = torch::randn({H, r}, gen);
  const auto file = tmp.file("te.safetensors");
  const std::string key = "lora_te1_text_model_encoder_layers_0_self_attn_q_proj";
  io::save_safetensors(file, {{key + ".lora_down.weight", down},
                              {key + ".lora_up.weight", up},
                              {key + ".alpha", torch::full({}, 1.0)}});
  const std::string param = "text_model.encoder.layers.0.self_attn.q_proj.weight";
  const auto original =
      models::load_clip_text_model(folder, torch::kCPU, torch::kFloat32, "text_encoder")
          ->named_parameters()[param]
          .clone();
  const auto expected = original + 0.5 * (1.0 / r) * torch::matmul(up, down);

  pipeline::FluxPipeline pipe(folder, torch::kCPU, torch::kFloat32);
  pipe.set_keep_text_encoders(false);
  const auto said = pipe.add_lora(file, 0.5);  // encoders not loaded: resolved by shapes
  EXPECT_NE(said.find("text_encoder"), std::string::npos) << said;
  auto weight = [&] { return pipe.text_encoders().clip()->named_parameters()[param]; };
  EXPECT_TRUE(torch::allclose(weight(), expected, 1e-6, 1e-6));
  pipeline::FluxTextToImage run;
  run.prompt = "a red boat";
  run.width = run.height = 32;
  run.sampling.steps = 1;
  run.sampling.max_sequence_length = 8;
  const auto with_lora = pipe.text_to_image(run).image;          // encodes, then frees the encoders
  EXPECT_TRUE(torch::allclose(weight(), expected, 1e-6, 1e-6));  // loaded again: merged again
  pipeline::FluxPipeline plain(folder, torch::kCPU, torch::kFloat32);
  EXPECT_FALSE(torch::allclose(plain.text_to_image(run).image, with_lora));
}

TEST(FluxPipeline, LorasInKohyasBflsAndXLabsNamesSplitTheFusedLayers) {
  const auto dir = test::flux_golden_dir();
  if (!have(dir)) GTEST_SKIP() << "no set at " << dir;
  const auto folder = io::ModelFolder::open(dir + "/model");
  auto model = models::load_flux_transformer(folder, torch::kCPU, torch::kFloat32);
  const auto& c = model->config();
  const int64_t D = c.inner_dim(), mlp = 4 * D, r = 2;
  auto gen = at::detail::createCPUGenerator(5);
  auto rnd = [&](int64_t rows, int64_t cols) {
    return torch::randn({rows, cols}, gen, torch::TensorOptions().dtype(torch::kFloat32));
  };
  const torch::Tensor qkv_up = rnd(3 * D, r), linear1_up = rnd(3 * D + mlp, r),
                      final_up = rnd(2 * D, r), down = rnd(r, D), proj_up = rnd(D, r);
  const auto alpha = torch::full({}, 4.0);
  // kohya's flattened BFL names, and ComfyUI's peft-style BFL names with the checkpoint prefix.
  const std::map<std::string, torch::Tensor> bfl = {
      {"lora_unet_double_blocks_0_img_attn_qkv.lora_down.weight", down},
      {"lora_unet_double_blocks_0_img_attn_qkv.lora_up.weight", qkv_up},
      {"lora_unet_double_blocks_0_img_attn_qkv.alpha", alpha},
      {"lora_unet_single_blocks_0_linear1.lora_down.weight", down},
      {"lora_unet_single_blocks_0_linear1.lora_up.weight", linear1_up},
      {"lora_unet_single_blocks_0_linear1.alpha", alpha},
      {"lora_unet_final_layer_adaLN_modulation_1.lora_down.weight", down},
      {"lora_unet_final_layer_adaLN_modulation_1.lora_up.weight", final_up},
      {"lora_unet_final_layer_adaLN_modulation_1.alpha", alpha},
      {"diffusion_model.double_blocks.0.txt_attn.proj.lora_A.weight", down},
      {"diffusion_model.double_blocks.0.txt_attn.proj.lora_B.weight", proj_up},
      {"diffusion_model.double_blocks.0.txt_attn.proj.alpha", alpha},
  };
  // The same update in diffusers' names.
  std::map<std::string, torch::Tensor> diffusers;
  auto pair = [&](const std::string& module, const torch::Tensor& up) {
    diffusers["transformer." + module + ".lora_A.weight"] = down;
    diffusers["transformer." + module + ".lora_B.weight"] = up;
    diffusers["transformer." + module + ".alpha"] = alpha;
  };
  const std::string d0 = "transformer_blocks.0.", s0 = "single_transformer_blocks.0.";
  pair(d0 + "attn.to_q", qkv_up.narrow(0, 0, D));
  pair(d0 + "attn.to_k", qkv_up.narrow(0, D, D));
  pair(d0 + "attn.to_v", qkv_up.narrow(0, 2 * D, D));
  pair(s0 + "attn.to_q", linear1_up.narrow(0, 0, D));
  pair(s0 + "attn.to_k", linear1_up.narrow(0, D, D));
  pair(s0 + "attn.to_v", linear1_up.narrow(0, 2 * D, D));
  pair(s0 + "proj_mlp", linear1_up.narrow(0, 3 * D, mlp));
  pair("norm_out.linear", torch::cat({final_up.narrow(0, D, D), final_up.narrow(0, 0, D)}));
  pair(d0 + "attn.to_add_out", proj_up);

  adapters::Network net{io::lora::transformer_names(), model.get()};
  net.file_layout = models::flux_bfl_layout({}, c);
  const auto a = adapters::make_lora(bfl, {}, "bfl.safetensors", {net}, {});
  const auto b = adapters::make_lora(diffusers, {}, "diffusers.safetensors", {net}, {});
  ASSERT_EQ(a.pairs.size(), 9u);
  ASSERT_EQ(b.pairs.size(), 9u);
  std::map<std::string, const adapters::LoraPair*> by_param;
  for (const auto& p : b.pairs) by_param[p.param] = &p;
  for (const auto& p : a.pairs) {
    ASSERT_TRUE(by_param.count(p.param)) << p.param << " from " << p.key;
    const auto& q = *by_param[p.param];
    EXPECT_TRUE(torch::equal(p.up, q.up)) << p.param;
    EXPECT_TRUE(torch::equal(p.down, q.down)) << p.param;
    EXPECT_EQ(p.factor, q.factor) << p.param;
  }
  // A fused up matrix with rows missing is refused, naming the file's tensor.
  auto cut = bfl;
  cut["lora_unet_single_blocks_0_linear1.lora_up.weight"] = linear1_up.narrow(0, 0, D);
  const auto msg = test::expect_throw<FormatError>(
      [&] { adapters::make_lora(cut, {}, "cut.safetensors", {net}, {}); });
  EXPECT_NE(msg.find("lora_unet_single_blocks_0_linear1.lora_up.weight"), std::string::npos) << msg;

  // XLabs' x-flux names of the same double-block updates (no alpha: factor 1 on both sides).
  net.module_aliases = models::flux_xlabs_lora_aliases(c);
  const std::map<std::string, torch::Tensor> xlabs = {
      {"double_blocks.0.processor.qkv_lora1.down.weight", down},
      {"double_blocks.0.processor.qkv_lora1.up.weight", qkv_up},
      {"double_blocks.0.processor.proj_lora2.down.weight", down},
      {"double_blocks.0.processor.proj_lora2.up.weight", proj_up}};
  const std::map<std::string, torch::Tensor> same_in_bfl = {
      {"lora_unet_double_blocks_0_img_attn_qkv.lora_down.weight", down},
      {"lora_unet_double_blocks_0_img_attn_qkv.lora_up.weight", qkv_up},
      {"lora_unet_double_blocks_0_txt_attn_proj.lora_down.weight", down},
      {"lora_unet_double_blocks_0_txt_attn_proj.lora_up.weight", proj_up}};
  const auto x = adapters::make_lora(xlabs, {}, "xlabs.safetensors", {net}, {});
  const auto y = adapters::make_lora(same_in_bfl, {}, "bfl.safetensors", {net}, {});
  ASSERT_EQ(x.pairs.size(), 4u);  // to_q, to_k, to_v, to_add_out
  ASSERT_EQ(y.pairs.size(), 4u);
  std::map<std::string, const adapters::LoraPair*> by_param_bfl;
  for (const auto& p : y.pairs) by_param_bfl[p.param] = &p;
  for (const auto& p : x.pairs) {
    ASSERT_TRUE(by_param_bfl.count(p.param)) << p.param << " from " << p.key;
    EXPECT_TRUE(torch::equal(p.up, by_param_bfl[p.param]->up)) << p.param;
    EXPECT_TRUE(torch::equal(p.down, by_param_bfl[p.param]->down)) << p.param;
    EXPECT_EQ(p.factor, by_param_bfl[p.param]->factor) << p.param;
  }
}

Image read_png_file(const std::string& path) {
  return read_png(path);
}

TEST(FluxCli, Txt2ImgOnFluxAndEditOnKontext) {
  const auto flux = test::flux_golden_dir(), kontext = test::flux_kontext_golden_dir();
  if (!have(flux) || !have(kontext)) GTEST_SKIP() << "no FLUX sets";
  test::TempDir dir;
  const auto out = dir.file("t2i.png");
  auto r =
      test::run_cli({"txt2img", "-m", flux + "/model", "-p", "a red boat", "-W", "48", "-H", "32",
                     "--steps", "2", "--max-sequence-length", "16", "--seed", "3", "-o", out, "-q"},
                    dir);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto img = read_png_file(out);
  EXPECT_EQ(img.width, 48);
  EXPECT_EQ(img.height, 32);

  const auto redrawn = dir.file("img2img.png");
  r = test::run_cli({"img2img", "-m", flux + "/model", "-i", out, "-p", "a blue boat", "--strength",
                     "0.5", "--steps", "2", "--max-sequence-length", "16", "-o", redrawn, "-q"},
                    dir);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(read_png_file(redrawn).width, 48);

  const auto edited = dir.file("edit.png");
  r = test::run_cli(
      {"edit", "-m", kontext + "/model", "-i", out, "-p", "make the boat blue", "--steps", "2",
       "--max-sequence-length", "16", "--no-auto-resize", "-o", edited, "-q"},
      dir);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto e = read_png_file(edited);
  EXPECT_EQ(e.width, 48);
  EXPECT_EQ(e.height, 32);

  // HiDream-only flags are refused with the reason, before anything loads.
  r = test::run_cli({"edit", "-m", kontext + "/model", "-i", out, "-p", "x", "--image-guidance",
                     "2", "-o", dir.file("x.png"), "-q"},
                    dir);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("Kontext has no image guidance"), std::string::npos) << r.err;
  // Editing needs a Kontext folder.
  r = test::run_cli(
      {"edit", "-m", flux + "/model", "-i", out, "-p", "x", "-o", dir.file("y.png"), "-q"}, dir);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("FLUX.1 Kontext"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(dir.file("y.png")));
}

}  // namespace test_flux_pipeline
}  // namespace diffuse
