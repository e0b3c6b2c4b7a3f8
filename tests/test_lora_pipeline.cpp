// LoRA through the Stable Diffusion pipeline (LoadOptions::loras, the CLI's --lora): an adapter
// built here from the tiny model's own weight names (kohya names for the UNet's attention
// projections and conv_in, peft names for the text encoder's q_proj) changes the image, scale 0
// gives exactly the plain image, offload merges the same weights, bad files fail the load.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>

#include "diffuse/pipeline.h"
#include "io/model_folder.h"
#include "io/safetensors.h"
#include "pipeline/stable_diffusion.h"
#include "pipeline_test_util.h"
#include "test_util.h"

namespace diffuse {
namespace test_lora_pipeline {

using test::fp32_cpu;

GenerationConfig small_config() {
  GenerationConfig g;
  g.prompts = {"a red fox"};
  g.steps = 2;
  g.width = 64;
  g.height = 64;
  g.seed = 1234;
  return g;
}

// Writes a rank-2 adapter over every to_q / to_v of the UNet (kohya), conv_in (kohya, 3x3) and
// every q_proj of the text encoder (peft); only_text_encoder leaves the UNet out.
std::string write_adapter(const test::TempDir& dir, const std::string& name,
                          bool only_text_encoder = false, bool add_unknown = false) {
  torch::manual_seed(11);
  std::vector<std::pair<std::string, torch::Tensor>> t;
  const std::string model = test::golden_model_dir();
  auto unet = io::SafetensorsFile::open(model + "/unet/diffusion_pytorch_model.safetensors");
  auto add = [&](const std::string& prefix, const torch::Tensor& w, bool kohya) {
    const int64_t r = 2, out = w.size(0);
    auto down = w.dim() == 4 ? torch::randn({r, w.size(1), w.size(2), w.size(3)})
                             : torch::randn({r, w.size(1)});
    auto up = w.dim() == 4 ? torch::randn({out, r, 1, 1}) : torch::randn({out, r});
    t.emplace_back(prefix + (kohya ? ".lora_down.weight" : ".lora_A.weight"), down * 0.3);
    t.emplace_back(prefix + (kohya ? ".lora_up.weight" : ".lora_B.weight"), up * 0.3);
    if (kohya) t.emplace_back(prefix + ".alpha", torch::tensor(1.0));
  };
  auto ends_with = [](const std::string& s, const std::string& e) {
    return s.size() >= e.size() && s.compare(s.size() - e.size(), e.size(), e) == 0;
  };
  if (!only_text_encoder) {
    for (const auto& k : unet->names()) {
      if (!(ends_with(k, "to_q.weight") || ends_with(k, "to_v.weight") || k == "conv_in.weight"))
        continue;
      std::string flat = k.substr(0, k.size() - 7);
      std::replace(flat.begin(), flat.end(), '.', '_');
      add("lora_unet_" + flat, unet->get(k), true);
    }
  }
  auto te = io::SafetensorsFile::open(model + "/text_encoder/model.safetensors");
  for (const auto& k : te->names())
    if (ends_with(k, "q_proj.weight"))
      add("text_encoder." + k.substr(0, k.size() - 7), te->get(k), false);
  if (add_unknown) add("lora_unet_no_such_module", torch::zeros({4, 4}), true);
  const std::string path = dir.file(name);
  io::save_safetensors(path, t);
  return path;
}

TEST(LoraPipeline, AdapterChangesTheImageAndScaleZeroKeepsIt) {
  test::TempDir dir;
  const std::string path = write_adapter(dir, "a.safetensors");
  auto plain = Text2Image::load(test::golden_model_dir(), fp32_cpu()).generate(small_config());

  auto with = fp32_cpu();
  with.loras = {{path, 1.0}};
  auto pipe = Text2Image::load(test::golden_model_dir(), with);
  ASSERT_EQ(pipe.info().loras.size(), 1u);
  EXPECT_NE(pipe.info().loras[0].find("unet"), std::string::npos) << pipe.info().loras[0];
  EXPECT_NE(pipe.info().loras[0].find("text_encoder"), std::string::npos);
  auto patched = pipe.generate(small_config());
  EXPECT_GT((patched.images_float - plain.images_float).abs().max().item<float>(), 1e-3);

  auto zero = fp32_cpu();
  zero.loras = {{path, 0.0}};
  auto same = Text2Image::load(test::golden_model_dir(), zero).generate(small_config());
  EXPECT_TRUE(torch::equal(same.images_float, plain.images_float));

  // Offload builds each network afresh per stage and merges the adapter again: same image.
  auto offload = with;
  offload.offload = true;
  auto off = Text2Image::load(test::golden_model_dir(), offload).generate(small_config());
  EXPECT_TRUE(torch::equal(off.images_float, patched.images_float))
      << "max |diff| " << (off.images_float - patched.images_float).abs().max().item<float>();
}

TEST(LoraPipeline, TextEncoderPartChangesThePromptEmbeddings) {
  test::TempDir dir;
  const std::string path = write_adapter(dir, "te.safetensors", /*only_text_encoder=*/true);
  pipeline::StableDiffusion plain(test::golden_model_dir(), fp32_cpu());
  auto with = fp32_cpu();
  with.loras = {{path, 1.0}, {path, -1.0}};  // two adapters that cancel
  pipeline::StableDiffusion cancelled(test::golden_model_dir(), with);
  with.loras = {{path, 0.5}};
  pipeline::StableDiffusion patched(test::golden_model_dir(), with);
  auto e0 = plain.encode_prompt({"a red fox"}, {}, 1, false).positive;
  auto e1 = patched.encode_prompt({"a red fox"}, {}, 1, false).positive;
  auto e2 = cancelled.encode_prompt({"a red fox"}, {}, 1, false).positive;
  EXPECT_GT((e1 - e0).abs().max().item<float>(), 1e-4);
  EXPECT_TRUE(torch::allclose(e2, e0, 1e-5, 1e-5));
}

// A rank-2 kohya adapter over every q_proj of `component` in `folder` (`prefix`: its kohya
// network prefix) and, with `unet`, every to_q of the UNet.
std::string write_kohya_adapter(const test::TempDir& dir, const std::string& name,
                                const std::string& folder, const std::string& component,
                                const std::string& prefix, bool unet) {
  torch::manual_seed(5);
  std::vector<std::pair<std::string, torch::Tensor>> t;
  auto add = [&](const std::string& module, const torch::Tensor& w) {
    std::string flat = module;
    std::replace(flat.begin(), flat.end(), '.', '_');
    t.emplace_back(flat + ".lora_down.weight", torch::randn({2, w.size(1)}) * 0.3);
    t.emplace_back(flat + ".lora_up.weight", torch::randn({w.size(0), 2}) * 0.3);
    t.emplace_back(flat + ".alpha", torch::tensor(2.0));
  };
  const auto f = io::ModelFolder::open(folder);
  auto ends = [](const std::string& s, const std::string& e) {
    return s.size() >= e.size() && s.compare(s.size() - e.size(), e.size(), e) == 0;
  };
  if (!component.empty())
    for (const auto& [k, w] : f.component_weights(component))
      if (ends(k, "q_proj.weight")) add(prefix + k.substr(0, k.size() - 7), w);
  if (unet)
    for (const auto& [k, w] : f.component_weights("unet"))
      if (ends(k, "to_q.weight")) add("lora_unet_" + k.substr(0, k.size() - 7), w);
  const std::string path = dir.file(name);
  io::save_safetensors(path, t);
  return path;
}

// SDXL's second text encoder (CLIP-G) takes LoRAs too (kohya lora_te2_*): the prompt embedding's
// CLIP-G columns and the pooled embedding change, CLIP-L's do not. A refiner (no CLIP-L) takes
// UNet adapters.
TEST(LoraPipeline, SdxlSecondTextEncoderAndRefinerTakeAdapters) {
  const std::string base = verify::GoldenSet::load(test::sdxl_golden_dir()).model_dir();
  if (!std::filesystem::exists(base + "/model_index.json")) GTEST_SKIP() << "no sdxl set";
  test::TempDir dir;
  const auto path =
      write_kohya_adapter(dir, "te2.safetensors", base, "text_encoder_2", "lora_te2_", false);
  pipeline::StableDiffusion plain(base, fp32_cpu());
  auto with = fp32_cpu();
  with.loras = {{path, 1.0}};
  pipeline::StableDiffusion patched(base, with);
  ASSERT_EQ(patched.info().loras.size(), 1u);
  EXPECT_NE(patched.info().loras[0].find("text_encoder_2"), std::string::npos)
      << patched.info().loras[0];
  const auto e0 = plain.encode_prompt({"a red fox"}, {}, 1, false);
  const auto e1 = patched.encode_prompt({"a red fox"}, {}, 1, false);
  const int64_t clip_l =
      io::ModelFolder::open(base).component_config("text_encoder").require<int64_t>("hidden_size");
  const auto width = e0.positive.size(-1);
  ASSERT_GT(width, clip_l);
  EXPECT_TRUE(torch::equal(e1.positive.narrow(-1, 0, clip_l), e0.positive.narrow(-1, 0, clip_l)));
  EXPECT_GT((e1.positive.narrow(-1, clip_l, width - clip_l) -
             e0.positive.narrow(-1, clip_l, width - clip_l))
                .abs()
                .max()
                .item<float>(),
            1e-4);
  EXPECT_GT((e1.pooled - e0.pooled).abs().max().item<float>(), 1e-4);

  const std::string refiner =
      (std::filesystem::path(base).parent_path() / "model_refiner").string();
  if (!std::filesystem::exists(refiner + "/model_index.json")) return;
  const auto unet_path =
      write_kohya_adapter(dir, "unet.safetensors", refiner, "", "", /*unet=*/true);
  auto g = small_config();
  g.width = g.height = 0;  // the refiner's own size
  auto refined_plain = Text2Image::load(refiner, fp32_cpu()).generate(g);
  auto r = fp32_cpu();
  r.loras = {{unet_path, 1.0}};
  auto refined = Text2Image::load(refiner, r).generate(g);
  EXPECT_GT((refined.images_float - refined_plain.images_float).abs().max().item<float>(), 1e-3);
}

TEST(LoraPipeline, UnknownKeysFailTheLoadUnlessLenient) {
  test::TempDir dir;
  const std::string path = write_adapter(dir, "bad.safetensors", false, /*add_unknown=*/true);
  auto o = fp32_cpu();
  o.loras = {{path, 1.0}};
  try {
    Text2Image::load(test::golden_model_dir(), o);
    ADD_FAILURE() << "no error";
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("lora_unet_no_such_module"), std::string::npos)
        << e.what();
  }
  o.lora_lenient = true;
  auto pipe = Text2Image::load(test::golden_model_dir(), o);
  ASSERT_EQ(pipe.info().loras.size(), 1u);
  EXPECT_NE(pipe.info().loras[0].find("warning"), std::string::npos) << pipe.info().loras[0];
}

// Every parameter of the pipeline's text encoder and UNet, cloned.
std::map<std::string, torch::Tensor> network_weights(pipeline::StableDiffusion& sd) {
  std::map<std::string, torch::Tensor> out;
  for (const auto& [component, module] : sd.loaded_networks())
    for (const auto& p : module->named_parameters())
      out.emplace(component + "." + p.key(), p.value().detach().clone());
  return out;
}

TEST(LoraPipeline, HotSwapBetweenGenerationsMatchesLoadingAndRestoresTheModelExactly) {
  test::TempDir dir;
  const std::string a = write_adapter(dir, "a.safetensors");
  const std::string te = write_adapter(dir, "te.safetensors", /*only_text_encoder=*/true);
  auto pipe = Text2Image::load(test::golden_model_dir(), fp32_cpu());
  const auto before = network_weights(*pipe.impl());
  auto g = small_config();
  const auto plain = pipe.generate(g).images_float;

  for (double scale : {1.0, 0.5}) {
    SCOPED_TRACE(scale);
    g.loras = {{a, scale}};
    const auto swapped = pipe.generate(g).images_float;
    auto load = fp32_cpu();
    load.loras = {{a, scale}};
    const auto loaded = Text2Image::load(test::golden_model_dir(), load).generate(small_config());
    EXPECT_TRUE(torch::equal(swapped, loaded.images_float));
    EXPECT_GT((swapped - plain).abs().max().item<float>(), 1e-3);
    ASSERT_EQ(pipe.info().loras.size(), 1u);
    EXPECT_NE(pipe.info().loras[0].find("scale " + c10::str(scale)), std::string::npos)
        << pipe.info().loras[0];
  }
  g.loras = {{a, 1.0}, {te, -0.5}};  // two at once
  EXPECT_EQ(pipe.generate(g).images_float.sizes(), plain.sizes());
  EXPECT_EQ(pipe.info().loras.size(), 2u);

  g.loras.clear();  // every weight back, bit for bit
  EXPECT_TRUE(torch::equal(pipe.generate(g).images_float, plain));
  EXPECT_TRUE(pipe.info().loras.empty());
  const auto after = network_weights(*pipe.impl());
  ASSERT_EQ(after.size(), before.size());
  for (const auto& [name, w] : before) EXPECT_TRUE(torch::equal(after.at(name), w)) << name;
}

TEST(LoraPipeline, HotSwapWithOffloadAndOnTopOfLoadedAdapters) {
  test::TempDir dir;
  const std::string a = write_adapter(dir, "a.safetensors");
  const std::string te = write_adapter(dir, "te.safetensors", /*only_text_encoder=*/true);
  auto both = fp32_cpu();
  both.loras = {{a, 1.0}, {te, 0.7}};
  const auto reference =
      Text2Image::load(test::golden_model_dir(), both).generate(small_config()).images_float;

  for (bool offload : {false, true}) {
    SCOPED_TRACE(offload);
    auto o = fp32_cpu();
    o.offload = offload;
    o.loras = {{a, 1.0}};  // always on; the run adds te
    auto pipe = Text2Image::load(test::golden_model_dir(), o);
    const auto only_a = pipe.generate(small_config()).images_float;
    auto g = small_config();
    g.loras = {{te, 0.7}};
    EXPECT_TRUE(torch::allclose(pipe.generate(g).images_float, reference, 1e-6, 1e-6));
    EXPECT_TRUE(torch::equal(pipe.generate(small_config()).images_float, only_a));
  }
}

TEST(LoraPipeline, ABadAdapterForOneRunLeavesTheModelAsItWas) {
  test::TempDir dir;
  const std::string bad = write_adapter(dir, "bad.safetensors", false, /*add_unknown=*/true);
  auto pipe = Text2Image::load(test::golden_model_dir(), fp32_cpu());
  const auto plain = pipe.generate(small_config()).images_float;
  auto g = small_config();
  g.loras = {{bad, 1.0}};
  EXPECT_THROW(pipe.generate(g), FormatError);
  g.loras = {{dir.file("missing.safetensors"), 1.0}};
  EXPECT_THROW(pipe.generate(g), IoError);
  g.loras = {{bad, std::nan("")}};
  EXPECT_THROW(pipe.generate(g), InvalidArgument);
  EXPECT_TRUE(pipe.info().loras.empty());
  EXPECT_TRUE(torch::equal(pipe.generate(small_config()).images_float, plain));
}

}  // namespace test_lora_pipeline
}  // namespace diffuse
