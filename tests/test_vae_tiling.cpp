// The VAE in tiles (models/vae_tiling.h, pipeline/vae_tiling_policy.h): the engine's tiled
// decode equals diffusers' tiled_decode transcribed literally; one tile is the whole image
// bit for bit; on the trained demo VAE tiles stay close to the whole image; any size comes
// out whole; the auto policy and bad options; and the pipeline uses it.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <iostream>
#include <random>
#include <vector>

#include "device/device.h"
#include "diffuse/errors.h"
#include "diffuse/pipeline.h"
#include "io/model_folder.h"
#include "models/autoencoder_kl.h"
#include "models/vae_tiling.h"
#include "pipeline/vae_tiling_policy.h"
#include "test_util.h"
#include "train/scene.h"

namespace diffuse {
namespace test_vae_tiling {

using models::AutoencoderKL;
using models::VaeTiling;

std::string demo_dir() {
  return std::string(DIFFUSE_SOURCE_DIR) + "/models/demo";
}

AutoencoderKL load(const std::string& dir) {
  return models::load_vae(io::ModelFolder::open(dir), torch::kCPU, torch::kFloat32);
}

// diffusers' AutoencoderKL.tiled_decode as written there (a list of decoded rows, then each
// tile blended in place with its upper and left neighbours, row by row and column by column,
// cropped to row_limit and concatenated): the independent computation ours must reproduce.
torch::Tensor diffusers_tiled_decode(models::AutoencoderKLImpl& vae, const torch::Tensor& z,
                                     int64_t tile_sample, double overlap) {
  const int64_t tile_latent = tile_sample / vae.config().spatial_factor();
  const auto overlap_size = static_cast<int64_t>(tile_latent * (1 - overlap));
  const auto blend_extent = static_cast<int64_t>(tile_sample * overlap);
  const int64_t row_limit = tile_sample - blend_extent;
  std::vector<std::vector<torch::Tensor>> rows;
  for (int64_t i = 0; i < z.size(2); i += overlap_size) {
    rows.emplace_back();
    for (int64_t j = 0; j < z.size(3); j += overlap_size)
      rows.back().push_back(
          vae.decode(z.slice(2, i, i + tile_latent).slice(3, j, j + tile_latent)));
  }
  auto blend = [](const torch::Tensor& a, torch::Tensor& b, int64_t dim, int64_t extent) {
    const int64_t e = std::min({a.size(dim), b.size(dim), extent});
    for (int64_t y = 0; y < e; ++y)
      b.select(dim, y).copy_(a.select(dim, a.size(dim) - e + y) * (1 - static_cast<double>(y) / e) +
                             b.select(dim, y) * (static_cast<double>(y) / e));
  };
  std::vector<torch::Tensor> result_rows;
  for (size_t i = 0; i < rows.size(); ++i) {
    std::vector<torch::Tensor> result_row;
    for (size_t j = 0; j < rows[i].size(); ++j) {
      auto& tile = rows[i][j];
      if (i > 0) blend(rows[i - 1][j], tile, 2, blend_extent);
      if (j > 0) blend(rows[i][j - 1], tile, 3, blend_extent);
      result_row.push_back(tile.slice(2, 0, row_limit).slice(3, 0, row_limit));
    }
    result_rows.push_back(torch::cat(result_row, 3));
  }
  return torch::cat(result_rows, 2);
}

double psnr(const torch::Tensor& a, const torch::Tensor& b) {
  // Images in [-1, 1]: a peak-to-peak range of 2.
  const double mse = (a - b).pow(2).mean().item<double>();
  return 10 * std::log10(4.0 / mse);
}

TEST(VaeTiling, DecodeEqualsDiffusersTiledDecode) {
  torch::NoGradGuard no_grad;
  auto vae = load(test::golden_model_dir());
  const int64_t f = vae->config().spatial_factor();
  torch::manual_seed(0);
  // 14 x 22 latent pixels in tiles of 8 (stride 6): 3 x 4 tiles, the last ones partial.
  auto z = torch::randn({2, vae->config().latent_channels, 14, 22});
  VaeTiling t{8 * f, 0.25};
  auto ours = models::tiled_decode(*vae, z, t);
  auto theirs = diffusers_tiled_decode(*vae, z, t.tile_size, t.overlap);
  ASSERT_EQ(ours.sizes(), theirs.sizes());
  EXPECT_EQ(ours.sizes(), torch::IntArrayRef({2, 3, 14 * f, 22 * f}));
  EXPECT_LT((ours - theirs).abs().max().item<double>(), 1e-5);
  // And it is not the whole image's decode (the tiles are really separate).
  EXPECT_GT((ours - vae->decode(z)).abs().max().item<double>(), 1e-4);
}

TEST(VaeTiling, OneTileIsTheWholeImageBitForBit) {
  torch::NoGradGuard no_grad;
  auto vae = load(test::golden_model_dir());
  const int64_t f = vae->config().spatial_factor();
  auto z = torch::randn({1, vae->config().latent_channels, 6, 5});
  VaeTiling t{8 * f, 0.25};
  EXPECT_FALSE(models::spans_several_tiles(t, 6 * f, 5 * f));
  EXPECT_TRUE(torch::equal(models::tiled_decode(*vae, z, t), vae->decode(z)));
  auto x = torch::rand({1, 3, 6 * f, 5 * f}) * 2 - 1;
  EXPECT_TRUE(torch::equal(models::tiled_encode(*vae, x, t).mean, vae->encode(x).mean));
}

TEST(VaeTiling, TrainedDemoVaeTilesStayCloseToTheWholeImage) {
  torch::NoGradGuard no_grad;
  auto vae = load(demo_dir());
  // A scene of the demo world at twice the size the model draws, in tiles of the VAE's own
  // sample_size (128 px): 3 x 3 tiles. GroupNorm sees one tile's statistics, so tiles are
  // close to the whole image, not equal to it.
  std::mt19937_64 rng(3);
  const Image scene = train::render_scene(train::sample_scene(rng), 256, 256);
  auto img =
      torch::from_blob(const_cast<uint8_t*>(scene.rgb.data()), {1, 256, 256, 3}, torch::kUInt8)
          .permute({0, 3, 1, 2})
          .to(torch::kFloat32)
          .div(127.5)
          .sub(1)
          .contiguous();
  auto z = vae->encode(img).mean;
  VaeTiling t{128, 0.25};
  auto whole = vae->decode(z);
  auto tiled = models::tiled_decode(*vae, z, t);
  const double decode_psnr = psnr(tiled, whole);
  EXPECT_GT(decode_psnr, 30.0);
  // Encoding in tiles as well: the decoded images agree as closely.
  auto tiled_mean = models::tiled_encode(*vae, img, t).mean;
  ASSERT_EQ(tiled_mean.sizes(), z.sizes());
  const double encode_psnr = psnr(vae->decode(tiled_mean), whole);
  EXPECT_GT(encode_psnr, 30.0);
  std::cout << "demo VAE, 256x256 scene in 128 px tiles vs whole: decode PSNR " << decode_psnr
            << " dB, max abs " << (tiled - whole).abs().max().item<double>() / 2
            << " (pixels in [0, 1]); tiled encode PSNR " << encode_psnr << " dB\n";
}

TEST(VaeTiling, AnySizeComesOutWhole) {
  torch::NoGradGuard no_grad;
  auto vae = load(test::golden_model_dir());
  const int64_t f = vae->config().spatial_factor();
  // Last tiles narrower than the blend (13 = 2 x 6 + 1), no overlap at all, and 1-pixel rows.
  for (auto [h, w, overlap] : std::vector<std::tuple<int64_t, int64_t, double>>{
           {13, 25, 0.25}, {17, 9, 0.0}, {1, 30, 0.5}, {9, 1, 0.25}}) {
    auto z = torch::randn({1, vae->config().latent_channels, h, w});
    auto out = models::tiled_decode(*vae, z, VaeTiling{8 * f, overlap});
    ASSERT_EQ(out.sizes(), torch::IntArrayRef({1, 3, h * f, w * f})) << h << "x" << w;
    EXPECT_TRUE(torch::isfinite(out).all().item<bool>());
    auto x = torch::rand({1, 3, h * f, w * f}) * 2 - 1;
    auto d = models::tiled_encode(*vae, x, VaeTiling{8 * f, overlap});
    EXPECT_EQ(d.mean.sizes(), torch::IntArrayRef({1, vae->config().latent_channels, h, w}));
  }
  // Without overlap the tiles are plain pieces: each equals that piece decoded alone.
  auto z = torch::randn({1, vae->config().latent_channels, 16, 16});
  auto out = models::tiled_decode(*vae, z, VaeTiling{8 * f, 0.0});
  auto piece = vae->decode(z.slice(2, 8, 16).slice(3, 0, 8));
  EXPECT_TRUE(torch::equal(out.slice(2, 8 * f, 16 * f).slice(3, 0, 8 * f), piece));
}

TEST(VaeTiling, BadTilesAndOptionsAreRefusedNamingTheField) {
  auto vae = load(test::golden_model_dir());
  const int64_t f = vae->config().spatial_factor();
  auto msg = test::expect_throw<InvalidArgument>([&] {
    models::check_vae_tiling(VaeTiling{8 * f + 1, 0.25}, vae->config());
  });
  EXPECT_NE(msg.find("tile size"), std::string::npos) << msg;
  EXPECT_NE(msg.find("multiple of " + std::to_string(f)), std::string::npos) << msg;
  msg = test::expect_throw<InvalidArgument>([&] {
    models::check_vae_tiling(VaeTiling{8 * f, 0.7}, vae->config());
  });
  EXPECT_NE(msg.find("overlap"), std::string::npos) << msg;
  VaeTilingOptions o;
  o.mode = "sometimes";
  msg = test::expect_throw<InvalidArgument>([&] { pipeline::validate_vae_tiling_options(o); });
  EXPECT_NE(msg.find("sometimes"), std::string::npos) << msg;
  o = {};
  o.tile_size = -8;
  EXPECT_NE(test::expect_throw<InvalidArgument>([&] {
              pipeline::validate_vae_tiling_options(o);
            }).find("tile_size"),
            std::string::npos);
  o = {};
  o.overlap = std::nan("");
  EXPECT_NE(test::expect_throw<InvalidArgument>([&] {
              pipeline::validate_vae_tiling_options(o);
            }).find("overlap"),
            std::string::npos);
}

TEST(VaeTiling, AutoTilesOnlyLargeImages) {
  auto cfg = load(demo_dir())->config();  // sample_size 128: tiles of 128 px by default
  auto choose = [&](const std::string& mode, int64_t h, int64_t w, int tile = 0) {
    VaeTilingOptions o;
    o.mode = mode;
    o.tile_size = tile;
    return pipeline::choose_vae_tiling(o, cfg, 1, h, w, torch::kCPU, torch::kFloat32);
  };
  EXPECT_FALSE(choose("auto", 512, 512).tiling);   // fits: the whole image, as diffusers
  EXPECT_TRUE(choose("auto", 1024, 1032).tiling);  // above 1024 x 1024 pixels
  EXPECT_EQ(choose("auto", 1024, 1032).tiling->tile_size, 128);
  EXPECT_FALSE(choose("off", 2048, 2048).tiling);
  EXPECT_TRUE(choose("on", 256, 128).tiling);
  EXPECT_FALSE(choose("on", 128, 128).tiling);  // one tile: nothing to tile
  EXPECT_EQ(choose("on", 512, 512, 256).tiling->tile_size, 256);
  EXPECT_TRUE(choose("auto", 512, 512).warning.empty());
  // The working set counts one tile, not the image.
  auto tiled = choose("on", 2048, 2048);
  EXPECT_LT(pipeline::vae_working_bytes(cfg, tiled.tiling, 1, 2048, 2048, torch::kFloat32) * 100,
            pipeline::vae_working_bytes(cfg, std::nullopt, 1, 2048, 2048, torch::kFloat32));
}

TEST(VaeTiling, PipelineDecodesInTilesWhenAsked) {
  LoadOptions lo;
  lo.device = "cpu";
  lo.dtype = "fp32";
  auto pipe = Text2Image::load(demo_dir(), lo);
  GenerationConfig g;
  g.prompts = {"a red circle on the left and a blue square on the right on a yellow background"};
  g.width = g.height = 256;
  g.steps = 4;
  g.seed = 7;
  auto whole = pipe.generate(g);
  g.vae_tiling.mode = "on";
  auto tiled = pipe.generate(g);
  ASSERT_EQ(tiled.images_float.sizes(), whole.images_float.sizes());
  EXPECT_TRUE(torch::equal(tiled.latents, whole.latents));  // only the decode changed
  const double diff = (tiled.images_float - whole.images_float).abs().max().item<double>();
  EXPECT_GT(diff, 0.0);
  const double mse = (tiled.images_float - whole.images_float).pow(2).mean().item<double>();
  EXPECT_GT(10 * std::log10(1.0 / mse), 30.0);  // PSNR in dB, pixels in [0, 1]
  g.vae_tiling.mode = "off";
  EXPECT_TRUE(torch::equal(pipe.generate(g).images_float, whole.images_float));
  g.vae_tiling.tile_size = 100;  // not a multiple of the VAE's 8 pixels
  g.vae_tiling.mode = "on";
  EXPECT_NE(test::expect_throw<InvalidArgument>([&] { pipe.generate(g); }).find("tile size"),
            std::string::npos);
}

}  // namespace test_vae_tiling
}  // namespace diffuse
