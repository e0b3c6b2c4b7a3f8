// HiDream sizes come from the folder's configs: a VAE with another number of blocks (another
// vae_scale_factor than the Flux VAE's 8) runs text-to-image and edit at sizes that are
// multiples of its factor times the patch size (issue 36: 8 was taken for granted).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>

#include "io/json_config.h"
#include "io/model_folder.h"
#include "models/autoencoder_kl.h"
#include "pipeline/component_writer.h"
#include "pipeline/hidream.h"
#include "test_util.h"
#include "verify/verify.h"

namespace diffuse {
namespace test_hidream_sizes {

namespace fs = std::filesystem;

// The golden HiDream folder with its VAE replaced by one of `blocks` blocks (random weights).
void copy_with_vae_blocks(const fs::path& from, const fs::path& to, size_t blocks) {
  for (const auto& entry : fs::directory_iterator(from)) {
    if (entry.path().filename() == "vae") continue;
    fs::create_symlink(fs::absolute(entry.path()), to / entry.path().filename());
  }
  std::ifstream in(from / "vae" / "config.json");
  auto config = nlohmann::json::parse(in);
  for (const char* key : {"block_out_channels", "down_block_types", "up_block_types"}) {
    auto list = config[key];
    ASSERT_GE(list.size(), blocks);
    config[key] = nlohmann::json(std::vector<nlohmann::json>(list.begin(), list.begin() + blocks));
  }
  pipeline::write_json_file(to / "vae" / "config.json", config);
  torch::manual_seed(3);
  models::AutoencoderKL vae(models::AutoencoderKLConfig::from_json(
      io::JsonConfig(config, (to / "vae" / "config.json").string())));
  pipeline::save_module_weights(*vae, to / "vae" / "diffusion_pytorch_model.safetensors", false,
                                "test_hidream_sizes");
}

TEST(HiDreamSizes, TheVaeScaleFactorComesFromTheVaeConfig) {
  const auto golden = test::hidream_golden_dir();
  if (!fs::exists(golden + "/cases.json")) GTEST_SKIP() << "no golden set at " << golden;
  const fs::path model = verify::GoldenSet::load(golden).model_dir();
  std::ifstream in(model / "vae" / "config.json");
  const size_t golden_blocks = nlohmann::json::parse(in)["block_out_channels"].size();
  ASSERT_GE(golden_blocks, 2u);
  test::TempDir tmp;
  copy_with_vae_blocks(model, tmp.path(), golden_blocks - 1);
  auto folder = io::ModelFolder::open(tmp.path().string());
  pipeline::HiDreamPipeline pipe(folder, torch::kCPU, torch::kFloat32);
  const int64_t f = int64_t{1} << (golden_blocks - 2);
  EXPECT_EQ(pipe.vae_scale_factor(), f);

  pipeline::HiDreamTextToImage t2i;
  t2i.prompt = "a red circle";
  t2i.sampling.steps = 1;
  t2i.width = 3 * static_cast<int>(pipe.size_multiple());
  t2i.height = 2 * static_cast<int>(pipe.size_multiple());
  const auto [w, h] = pipe.normalized_size(t2i.width, t2i.height, pipe.area_side());
  const auto made = pipe.text_to_image(t2i);
  ASSERT_EQ(made.image.dim(), 4);
  EXPECT_EQ(made.image.size(1), h);
  EXPECT_EQ(made.image.size(2), w);
  EXPECT_EQ(h % pipe.size_multiple(), 0);
  EXPECT_EQ(w % pipe.size_multiple(), 0);
  EXPECT_EQ(made.latents.size(2) * f, h);
  EXPECT_EQ(made.latents.size(3) * f, w);

  pipeline::HiDreamEdit edit;
  edit.prompt = "make it blue";
  edit.sampling.steps = 1;
  edit.image = torch::full({50, 70, 3}, 200, torch::kUInt8);
  const auto edited = pipe.edit(edit);
  EXPECT_EQ(edited.image.size(1) % pipe.size_multiple(), 0);
  EXPECT_EQ(edited.image.size(2) % pipe.size_multiple(), 0);
  EXPECT_EQ(edited.latents.size(3) * f, edited.image.size(2));
}

}  // namespace test_hidream_sizes
}  // namespace diffuse
