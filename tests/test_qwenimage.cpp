// Qwen-Image and Qwen-Image-Edit (issue 66): every case of the qwen-image-tiny golden set
// through the verify code with every recorded output compared; the image processor's rounding;
// the CLI drawing and editing on the tiny folder; and bad input (a folder without the processor,
// a text encoder without its vision tower, sources smaller than a patch or too elongated, an
// edit on a text-to-image folder) refused with a clear error before the weights load.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>

#include "cli_run.h"
#include "diffuse/errors.h"
#include "diffuse/image.h"
#include "golden_case_check.h"
#include "io/json_config.h"
#include "io/model_folder.h"
#include "pipeline/qwen_vl_image_processor.h"
#include "pipeline/qwenimage.h"
#include "pipeline/stable_diffusion.h"
#include "test_util.h"

namespace diffuse {
namespace test_qwenimage {

namespace fs = std::filesystem;

std::string set_dir() {
  return test::qwen_image_golden_dir();
}
std::string model_dir() {
  return set_dir() + "/model";
}
bool have() {
  return fs::exists(set_dir() + "/cases.json");
}

// A copy of the tiny model folder: components linked, except `drop`; model_index.json with
// `pipeline_class`; text_encoder/config.json rewritten by `edit_text_config` when given.
std::string folder_copy(const test::TempDir& tmp, const std::string& drop,
                        const std::string& pipeline_class = "QwenImageEditPipeline",
                        bool without_vision_config = false) {
  const fs::path out = tmp.path() / "model";
  fs::create_directories(out);
  for (const auto& entry : fs::directory_iterator(model_dir())) {
    const auto name = entry.path().filename().string();
    if (!entry.is_directory() || name == drop) continue;
    if (name == "text_encoder" && without_vision_config) {
      fs::create_directories(out / name);
      for (const auto& f : fs::directory_iterator(entry.path()))
        if (f.path().filename() != "config.json")
          fs::create_symlink(f.path(), out / name / f.path().filename());
      auto cfg = io::JsonConfig::load((entry.path() / "config.json").string()).json();
      cfg.erase("vision_config");
      std::ofstream(out / name / "config.json") << cfg.dump(2);
      continue;
    }
    fs::create_directory_symlink(entry.path(), out / name);
  }
  auto index = io::JsonConfig::load(model_dir() + "/model_index.json").json();
  index["_class_name"] = pipeline_class;
  std::ofstream(out / "model_index.json") << index.dump(2);
  return out.string();
}

torch::Tensor noise_image(int64_t h, int64_t w) {
  auto gen = at::detail::createCPUGenerator(5);
  return torch::randint(0, 256, {h, w, 3}, gen, torch::kInt64).to(torch::kUInt8);
}

void write_png_of(const std::string& path, const torch::Tensor& u8) {
  Image img;
  img.height = static_cast<int>(u8.size(0));
  img.width = static_cast<int>(u8.size(1));
  const auto c = u8.contiguous();
  img.rgb.assign(c.data_ptr<uint8_t>(), c.data_ptr<uint8_t>() + c.numel());
  write_png(path, img);
}

TEST(QwenImageGolden, EveryCasePassesWithEveryOutputCompared) {
  if (!have()) GTEST_SKIP() << "no set at " << set_dir();
  test::expect_golden_set_passes(set_dir());
}

TEST(QwenImageProcessor, SmartResizeRoundsHalvesToEvenAndKeepsThePixelBounds) {
  // 42 / 28 = 1.5 -> 2 and 70 / 28 = 2.5 -> 2 (Python's round), so both become 56.
  EXPECT_EQ(pipeline::qwen_smart_resize(42, 70, 28, 56, 1 << 30),
            std::make_pair(int64_t{56}, int64_t{56}));
  // Below min_pixels: scaled up, each side rounded up to the factor.
  const auto [h, w] = pipeline::qwen_smart_resize(30, 40, 28, 3136, 12845056);
  EXPECT_EQ(h, 56);
  EXPECT_EQ(w, 84);
  // Above max_pixels: scaled down inside the bound.
  const auto [bh, bw] = pipeline::qwen_smart_resize(4000, 3000, 28, 3136, 1000000);
  EXPECT_LE(bh * bw, 1000000);
  EXPECT_EQ(bh % 28, 0);
  EXPECT_EQ(bw % 28, 0);
  EXPECT_THROW(pipeline::qwen_smart_resize(10, 2100, 28, 3136, 12845056), InvalidArgument);
  EXPECT_THROW(pipeline::qwen_smart_resize(0, 20, 28, 3136, 12845056), InvalidArgument);
}

TEST(QwenImageProcessor, PatchesFollowTheGridOfTheResizedImage) {
  if (!have()) GTEST_SKIP() << "no set at " << set_dir();
  const auto cfg = pipeline::QwenVLImageProcessorConfig::from_folder(model_dir() + "/processor");
  const auto out = pipeline::qwen_vl_preprocess(noise_image(100, 60), cfg);
  EXPECT_EQ(out.grid_thw[0], 1);
  EXPECT_EQ(out.pixel_values.size(0), out.grid_thw[1] * out.grid_thw[2]);
  EXPECT_EQ(out.pixel_values.size(1),
            3 * cfg.temporal_patch_size * cfg.patch_size * cfg.patch_size);
  EXPECT_THROW(pipeline::qwen_vl_preprocess(torch::zeros({8, 8}, torch::kUInt8), cfg),
               InvalidArgument);
}

TEST(QwenImageEditSize, SourceIsScaledToAboutOneMegapixelInMultiplesOf32) {
  // The golden set's 100x60 source became 1312x800.
  EXPECT_EQ(pipeline::QwenImagePipeline::edit_source_size(100, 60),
            std::make_pair(int64_t{1312}, int64_t{800}));
  EXPECT_EQ(pipeline::QwenImagePipeline::edit_source_size(512, 512),
            std::make_pair(int64_t{1024}, int64_t{1024}));
}

TEST(QwenImageBadInput, EditFolderWithoutProcessorIsRefusedBeforeLoading) {
  if (!have()) GTEST_SKIP() << "no set at " << set_dir();
  test::TempDir tmp;
  const auto dir = folder_copy(tmp, "processor");
  try {
    pipeline::QwenImagePipeline pipe(io::ModelFolder::open(dir), torch::kCPU, torch::kFloat32);
    FAIL() << "no error";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("processor"), std::string::npos) << e.what();
  }
}

TEST(QwenImageBadInput, EditWithATextEncoderWithoutVisionTowerIsRefused) {
  if (!have()) GTEST_SKIP() << "no set at " << set_dir();
  test::TempDir tmp;
  const auto dir = folder_copy(tmp, "", "QwenImageEditPipeline", /*without_vision_config=*/true);
  try {
    pipeline::QwenImagePipeline pipe(io::ModelFolder::open(dir), torch::kCPU, torch::kFloat32);
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("vision tower"), std::string::npos) << e.what();
  }
}

TEST(QwenImageBadInput, SourcesSmallerThanAPatchOrTooElongatedAreRefused) {
  if (!have()) GTEST_SKIP() << "no set at " << set_dir();
  pipeline::QwenImagePipeline pipe(io::ModelFolder::open(model_dir()), torch::kCPU,
                                   torch::kFloat32);
  pipeline::QwenImageEdit e;
  e.prompt = "x";
  e.sampling.steps = 1;
  for (const auto& [h, w, what] :
       {std::tuple<int64_t, int64_t, const char*>{10, 10, "at least"}, {14, 3000, "aspect"}}) {
    e.image = noise_image(h, w);
    try {
      pipe.edit(e);
      FAIL() << "no error for " << h << "x" << w;
    } catch (const InvalidArgument& err) {
      EXPECT_NE(std::string(err.what()).find(what), std::string::npos) << err.what();
    }
  }
}

TEST(QwenImageBadInput, EditOnATextToImageFolderSaysWhatItNeeds) {
  if (!have()) GTEST_SKIP() << "no set at " << set_dir();
  test::TempDir tmp;
  const auto dir = folder_copy(tmp, "", "QwenImagePipeline");
  pipeline::QwenImagePipeline pipe(io::ModelFolder::open(dir), torch::kCPU, torch::kFloat32);
  EXPECT_FALSE(pipe.is_edit_model());
  pipeline::QwenImageEdit e;
  e.prompt = "x";
  e.image = noise_image(64, 64);
  EXPECT_THROW(pipe.edit(e), InvalidArgument);
}

TEST(QwenImageCli, DrawsAndEditsOnTheTinyFolder) {
  if (!have()) GTEST_SKIP() << "no set at " << set_dir();
  test::TempDir tmp;
  const auto drawn = tmp.file("drawn.png");
  auto r = test::run_cli({"txt2img", "-m", model_dir(), "-p", "a red house", "-W", "96", "-H", "64",
                          "--steps", "2", "--seed", "3", "-o", drawn, "--quiet"},
                         tmp);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto img = read_png(drawn);
  EXPECT_EQ(img.width, 96);
  EXPECT_EQ(img.height, 64);
  // The same seed draws the same picture.
  const auto again = tmp.file("again.png");
  r = test::run_cli({"txt2img", "-m", model_dir(), "-p", "a red house", "-W", "96", "-H", "64",
                     "--steps", "2", "--seed", "3", "-o", again, "--quiet"},
                    tmp);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(read_png(again).rgb, img.rgb);

  const auto source = tmp.file("source.png");
  write_png_of(source, noise_image(60, 100));
  const auto edited = tmp.file("edited.png");
  r = test::run_cli({"edit", "-m", model_dir(), "-p", "turn the sky orange", "-i", source,
                     "--steps", "2", "--seed", "4", "-o", edited, "--quiet"},
                    tmp);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto out = read_png(edited);  // the ~1 MP size of the source's aspect ratio
  EXPECT_EQ(out.width, 1312);
  EXPECT_EQ(out.height, 800);
}

TEST(QwenImageCli, BadInputFailsWithAMessageAndNoOutput) {
  if (!have()) GTEST_SKIP() << "no set at " << set_dir();
  test::TempDir tmp;
  const auto tiny = tmp.file("tiny.png");
  write_png_of(tiny, noise_image(8, 8));
  const auto out = tmp.file("out.png");
  auto r = test::run_cli(
      {"edit", "-m", model_dir(), "-p", "x", "-i", tiny, "--steps", "2", "-o", out}, tmp);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("at least 14 pixels"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(out));
  // One step: shift_terminal cannot stretch a schedule that ends at pure noise.
  r = test::run_cli(
      {"txt2img", "-m", model_dir(), "-p", "x", "-W", "32", "-H", "32", "--steps", "1", "-o", out},
      tmp);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("at least 2 steps"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(out));
  const auto source = tmp.file("source.png");
  write_png_of(source, noise_image(64, 64));
  r = test::run_cli(
      {"edit", "-m", model_dir(), "-p", "x", "-i", source, "--image-guidance", "2", "-o", out},
      tmp);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--image-guidance"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(out));
}

}  // namespace test_qwenimage
}  // namespace diffuse
