// `diffuse train-demo --arch hidream-e1` at toy size: all four tokenizers are learned, a run
// writes a folder in HiDream's layout that the normal HiDream pipeline loads and runs for both
// jobs (text-to-image and editing) with the defaults the folder keeps, and bad options are
// refused before anything is written.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include "diffuse/errors.h"
#include "io/model_folder.h"
#include "pipeline/hidream.h"
#include "pipeline/hidream_variant.h"
#include "test_util.h"
#include "train/demo_trainer.h"

namespace diffuse::train {
namespace test_train_hidream_demo {

namespace fs = std::filesystem;

TrainDemoOptions toy_options(const std::string& out) {
  TrainDemoOptions o;
  o.arch = "hidream-e1";
  o.out = out;
  o.seed = 7;
  o.vae_steps = 2;
  o.unet_steps = 3;
  o.resolution = 32;
  o.vae_batch = 2;
  o.vae_crop = 16;
  o.unet_batch = 3;
  o.dataset_size = 6;
  o.precision = "fp32";
  return o;
}

TEST(TrainHiDreamDemo, WritesAHiDreamFolderThatBothJobsRunOn) {
  test::TempDir dir;
  const auto o = toy_options(dir.file("model"));
  const auto report = train_demo(o);
  EXPECT_EQ(report.vae_steps, 2);
  EXPECT_EQ(report.unet_steps, 3);
  EXPECT_GT(report.scaling_factor, 0);
  for (const char* f :
       {"model_index.json", "training.json", "scheduler/scheduler_config.json",
        "tokenizer/vocab.json", "tokenizer_2/merges.txt", "tokenizer_3/spiece.model",
        "tokenizer_4/tokenizer.json", "text_encoder/model.safetensors",
        "text_encoder_2/model.safetensors", "text_encoder_3/model.safetensors",
        "text_encoder_4/model.safetensors", "transformer/diffusion_pytorch_model.safetensors",
        "vae/diffusion_pytorch_model.safetensors"})
    EXPECT_TRUE(fs::exists(fs::path(o.out) / f)) << f;

  const auto folder = io::ModelFolder::open(o.out);
  EXPECT_TRUE(pipeline::is_hidream_folder(o.out));
  const auto defaults = pipeline::hidream_defaults(folder);
  EXPECT_EQ(defaults.variant, "model folder");
  const int64_t seq = pipeline::hidream_max_sequence_length(folder);
  EXPECT_GE(seq, 16);
  EXPECT_EQ(seq % 8, 0);

  pipeline::HiDreamPipeline pipe(folder, torch::Device(torch::kCPU), torch::kFloat32);
  EXPECT_EQ(pipe.area_side(), 32);
  pipeline::HiDreamTextToImage t;
  t.prompt = "a red circle on the left on a blue background";
  t.width = t.height = 32;
  t.sampling.steps = 2;
  t.sampling.guidance_scale = defaults.guidance_scale;
  const auto image = pipe.text_to_image(t);
  EXPECT_EQ(image.image.sizes(), (std::vector<int64_t>{1, 32, 32, 3}));
  // The folder's sequence length reached every encoder.
  EXPECT_EQ(static_cast<int64_t>(image.prompt_embeddings.t5_ids.input_ids[0].size()), seq);
  EXPECT_EQ(static_cast<int64_t>(image.prompt_embeddings.llama_ids.input_ids[0].size()), seq);

  pipeline::HiDreamEdit e;
  e.prompt =
      "Editing Instruction: make the background green. Target Image Description: a red circle "
      "on the left on a green background.";
  e.image = torch::full({32, 32, 3}, 200, torch::kUInt8);
  e.image_guidance_scale = defaults.image_guidance_scale;
  e.sampling.steps = 2;
  e.sampling.guidance_scale = defaults.guidance_scale;
  const auto edited = pipe.edit(e);
  EXPECT_EQ(edited.image.sizes(), (std::vector<int64_t>{1, 32, 32, 3}));
  EXPECT_TRUE(torch::isfinite(edited.image).all().item<bool>());
}

// --init-from: a second run starts from the first one's weights and keeps its tokenizers,
// autoencoder and latent normalisation (training only the transformer and text encoders), and
// its record names where it came from.
TEST(TrainHiDreamDemo, InitFromContinuesAnEarlierRun) {
  test::TempDir dir;
  const auto first = toy_options(dir.file("first"));
  train_demo(first);
  auto o = toy_options(dir.file("second"));
  o.init_from = first.out;
  o.seed = 8;
  const auto report = train_demo(o);
  EXPECT_EQ(report.vae_steps, 0);
  EXPECT_EQ(report.unet_steps, 3);
  auto read = [](const fs::path& p) { return test::read_file(p.string()); };
  for (const char* f : {"vae/config.json", "tokenizer/vocab.json", "tokenizer_3/spiece.model",
                        "tokenizer_4/tokenizer.json", "text_encoder_4/config.json"})
    EXPECT_EQ(read(fs::path(o.out) / f), read(fs::path(first.out) / f)) << f;
  // Weights by value (the files' metadata name the run that wrote them).
  auto same_weights = [&](const char* file) {
    const auto a = io::load_weights_file((fs::path(o.out) / file).string());
    const auto b = io::load_weights_file((fs::path(first.out) / file).string());
    if (a.size() != b.size()) return false;
    for (const auto& [name, t] : a)
      if (!b.count(name) || !torch::equal(t, b.at(name))) return false;
    return true;
  };
  EXPECT_TRUE(same_weights("vae/diffusion_pytorch_model.safetensors"));
  EXPECT_FALSE(same_weights("transformer/diffusion_pytorch_model.safetensors"));
  const auto record = nlohmann::json::parse(read(fs::path(o.out) / "training.json"));
  EXPECT_EQ(record["init_from"]["folder"], first.out);
  EXPECT_EQ(record["init_from"]["training"]["seed"], 7);
  EXPECT_NE(record["command"].get<std::string>().find("--init-from " + first.out),
            std::string::npos);

  // Refused before anything is written: the output folder itself, another resolution, a
  // folder that is not a hidream-e1 run, the SD architecture.
  auto bad = toy_options(first.out);
  bad.init_from = first.out;
  bad.force = true;
  EXPECT_THROW(train_demo(bad), InvalidArgument);
  EXPECT_TRUE(fs::exists(fs::path(first.out) / "training.json"));
  bad = toy_options(dir.file("third"));
  bad.init_from = first.out;
  bad.resolution = 64;
  EXPECT_THROW(train_demo(bad), InvalidArgument);
  bad.resolution = 32;
  bad.init_from = dir.file("nothing-here");
  EXPECT_THROW(train_demo(bad), IoError);
  bad.init_from = first.out;
  bad.arch = "sd";
  EXPECT_THROW(train_demo(bad), InvalidArgument);
  EXPECT_FALSE(fs::exists(dir.file("third")));
}

TEST(TrainHiDreamDemo, RefusesBadOptionsBeforeWritingAnything) {
  test::TempDir dir;
  auto o = toy_options(dir.file("model"));
  o.resolution = 48;  // not a multiple of VAE factor x patch (32)
  EXPECT_THROW(train_demo(o), InvalidArgument);
  o = toy_options(dir.file("model"));
  o.vae_crop = 24;  // not a multiple of the VAE factor (16)
  EXPECT_THROW(train_demo(o), InvalidArgument);
  o = toy_options(dir.file("model"));
  o.vae_batch = 100000000;
  EXPECT_THROW(train_demo(o), InvalidArgument);
  o = toy_options(dir.file("model"));
  o.arch = "flux";
  EXPECT_THROW(train_demo(o), InvalidArgument);
  EXPECT_TRUE(fs::is_empty(dir.path()));
}

}  // namespace test_train_hidream_demo
}  // namespace diffuse::train
