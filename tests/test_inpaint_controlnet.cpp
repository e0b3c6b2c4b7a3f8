// Inpainting and ControlNet (issue 65): every case of the sd2-inpaint-tiny and
// sd2-controlnet-tiny golden sets through the verify code with every recorded output compared;
// the kept region of an "inpaint only masked" run equal to the source pixel for pixel; the
// mask helpers; and bad input, in the library and on the command line.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <iostream>

#include <png.h>

#include "cli_run.h"
#include "diffuse/errors.h"
#include "diffuse/image.h"
#include "diffuse/pipeline.h"
#include "golden_case_check.h"
#include "io/json_config.h"
#include "io/model_folder.h"
#include "io/safetensors.h"
#include "models/controlnet.h"
#include "pipeline/control_image.h"
#include "pipeline/controlnet_step.h"
#include "pipeline/inpaint_mask.h"
#include "pipeline/stable_diffusion.h"
#include "server/job_wire.h"
#include "server/request_conditions.h"
#include "server_test_util.h"
#include "test_util.h"
#include "verify/verify.h"

namespace diffuse {
namespace test_inpaint_controlnet {

namespace fs = std::filesystem;

std::string inpaint_dir() {
  return test::sibling_golden_dir("DIFFUSE_INPAINT_GOLDEN_DIR", "sd2-inpaint-tiny");
}
std::string control_dir() {
  return test::sibling_golden_dir("DIFFUSE_CONTROLNET_GOLDEN_DIR", "sd2-controlnet-tiny");
}
bool have(const std::string& dir) {
  return fs::exists(dir + "/cases.json");
}

// Every case passes, and every output the reference recorded was compared (not only the final
// image), but for the debugging intermediates of a float decode the 8-bit overlay supersedes and
// the noise it drew (which the replay feeds in).
void expect_set_passes(const std::string& dir) {
  test::expect_golden_set_passes(dir, {}, [](const std::string& name) {
    return name == "decoded" || name == "noise_initial" || name.rfind("posterior_noise", 0) == 0;
  });
}

TEST(InpaintGolden, EveryCasePasses) {
  if (!have(inpaint_dir())) GTEST_SKIP() << "no set at " << inpaint_dir();
  expect_set_passes(inpaint_dir());
}

TEST(ControlNetGolden, EveryCasePasses) {
  if (!have(control_dir())) GTEST_SKIP() << "no set at " << control_dir();
  expect_set_passes(control_dir());
}

// A source picture and a mask with a white rectangle (repaint) in the middle.
struct Scene {
  Image source;
  torch::Tensor mask;  // uint8 [H, W]
};

Scene scene(int height, int width) {
  Scene s;
  s.source.width = width;
  s.source.height = height;
  auto gen = at::detail::createCPUGenerator(7);
  const auto px = torch::randint(0, 256, {height, width, 3}, gen, torch::kInt64).to(torch::kUInt8);
  s.source.rgb.assign(px.data_ptr<uint8_t>(), px.data_ptr<uint8_t>() + px.numel());
  s.mask = torch::zeros({height, width}, torch::kUInt8);
  s.mask.slice(0, height / 4, height / 2).slice(1, width / 3, width / 2).fill_(255);
  return s;
}

TEST(Inpaint, OnlyMaskedKeepsEveryUnmaskedPixelOfTheSource) {
  if (!have(inpaint_dir())) GTEST_SKIP() << "no set at " << inpaint_dir();
  const auto set = verify::GoldenSet::load(inpaint_dir());
  auto pipe = Image2Image::load(set.model_dir());
  const auto s = scene(64, 96);
  GenerationConfig g;
  g.prompts = {"a red apple"};
  g.steps = 3;
  g.seed = 5;
  g.strength = 1.0;
  g.inpaint.mask = s.mask;
  g.inpaint.crop_padding = 4;
  const auto r = pipe.generate(g, s.source);
  ASSERT_EQ(r.images.size(), 1u);
  const auto& out = r.images[0];
  ASSERT_EQ(out.width, s.source.width);
  ASSERT_EQ(out.height, s.source.height);
  int64_t kept = 0, changed_inside = 0;
  for (int y = 0; y < out.height; ++y)
    for (int x = 0; x < out.width; ++x) {
      const bool repaint = s.mask[y][x].item<uint8_t>() != 0;
      for (int ch = 0; ch < 3; ++ch) {
        const size_t i = (static_cast<size_t>(y) * out.width + x) * 3 + ch;
        if (!repaint) {
          ASSERT_EQ(out.rgb[i], s.source.rgb[i]) << "kept pixel (" << x << ", " << y << ")";
          ++kept;
        } else {
          changed_inside += out.rgb[i] != s.source.rgb[i];
        }
      }
    }
  EXPECT_GT(kept, 0);
  EXPECT_GT(changed_inside, 0) << "nothing was repainted";
}

TEST(Inpaint, AnAllBlackMaskIsRefusedAndAnInpaintingUnetNeedsAMask) {
  if (!have(inpaint_dir())) GTEST_SKIP() << "no set at " << inpaint_dir();
  const auto set = verify::GoldenSet::load(inpaint_dir());
  auto pipe = Image2Image::load(set.model_dir());
  auto s = scene(64, 64);
  GenerationConfig g;
  g.prompts = {"x"};
  g.steps = 2;
  g.inpaint.mask = torch::zeros({64, 64}, torch::kUInt8);
  EXPECT_NE(
      test::expect_throw<InvalidArgument>([&] { pipe.generate(g, s.source); }).find("all black"),
      std::string::npos);
  g.inpaint.mask = torch::Tensor();
  EXPECT_NE(
      test::expect_throw<InvalidArgument>([&] { pipe.generate(g, s.source); }).find("needs a mask"),
      std::string::npos);
  g.inpaint.mask = torch::zeros({64, 64}, torch::kFloat32);
  EXPECT_NE(test::expect_throw<InvalidArgument>([&] { pipe.generate(g, s.source); }).find("8-bit"),
            std::string::npos);
}

TEST(InpaintMask, InvertBlurAndGreyConversionFollowPillow) {
  auto rgb = torch::tensor({255, 0, 0, 0, 255, 0, 0, 0, 255, 128, 128, 128}, torch::kUInt8)
                 .view({2, 2, 3});
  const auto l = pipeline::mask_to_gray(rgb);
  // Pillow: (R*19595 + G*38470 + B*7471 + 0x8000) >> 16.
  EXPECT_EQ(l[0][0].item<uint8_t>(), 76);
  EXPECT_EQ(l[0][1].item<uint8_t>(), 150);
  EXPECT_EQ(l[1][0].item<uint8_t>(), 29);
  EXPECT_EQ(l[1][1].item<uint8_t>(), 128);
  const auto inv = pipeline::adjust_mask(l, true, 0);
  EXPECT_TRUE(torch::equal(inv, 255 - l));
  const auto flat = torch::full({9, 9}, 200, torch::kUInt8);
  EXPECT_TRUE(torch::equal(pipeline::adjust_mask(flat, false, 2.5), flat));
  // 127/255 < 0.5 <= 128/255.
  const auto m =
      pipeline::preprocess_mask(torch::tensor({127, 128}, torch::kUInt8).view({1, 2}), 1, 2);
  EXPECT_EQ(m[0][0][0][0].item<float>(), 0.f);
  EXPECT_EQ(m[0][0][0][1].item<float>(), 1.f);
  EXPECT_THROW(pipeline::adjust_mask(l, false, -1), InvalidArgument);
}

TEST(InpaintMask, CropRegionCoversTheMaskAtTheProcessingAspect) {
  auto mask = torch::zeros({64, 128}, torch::kUInt8);
  mask.slice(0, 20, 30).slice(1, 70, 80).fill_(255);
  const auto [x1, y1, x2, y2] = pipeline::mask_crop_region(mask, 128, 64, 4);
  EXPECT_LE(x1, 66);
  EXPECT_GE(x2, 84);
  EXPECT_LE(y1, 16);
  EXPECT_GE(y2, 34);
  EXPECT_NEAR(static_cast<double>(x2 - x1) / (y2 - y1), 2.0, 0.1);
  EXPECT_THROW(pipeline::mask_crop_region(torch::zeros({8, 8}, torch::kUInt8), 8, 8, 0),
               InvalidArgument);
}

TEST(ControlImage, CannyGivesWhiteEdgesOnBlackInThreeEqualChannels) {
  auto img = torch::zeros({32, 32, 3}, torch::kUInt8);
  img.slice(1, 16, 32).fill_(255);  // one vertical edge
  torch::Tensor edges;
  try {
    edges = pipeline::apply_control_preprocessor(img, "canny:50:100");
  } catch (const Unsupported& e) {
    GTEST_SKIP() << e.what();
  }
  ASSERT_EQ(edges.sizes(), img.sizes());
  EXPECT_TRUE(torch::equal(edges.select(2, 0), edges.select(2, 1)));
  EXPECT_TRUE(((edges == 0) | (edges == 255)).all().item<bool>());
  EXPECT_GT((edges > 0).sum().item<int64_t>(), 0);
  EXPECT_EQ(edges.slice(1, 0, 8).sum().item<int64_t>(), 0);  // nothing far from the edge
  for (const char* bad : {"sobel", "canny:1", "canny:a:b", "canny:200:100", "none:3"})
    EXPECT_THROW(pipeline::validate_control_preprocessor(bad), InvalidArgument) << bad;
}

TEST(ControlNet, ALayoutThatDoesNotFitTheUnetIsRefusedNamingBoth) {
  if (!have(control_dir())) GTEST_SKIP() << "no set at " << control_dir();
  const auto set = verify::GoldenSet::load(control_dir());
  auto net = models::load_controlnet(set.model_dir() + "/controlnet", torch::kCPU, torch::kFloat32);
  auto unet = models::UNet2DConditionConfig::from_json(
      io::JsonConfig::load(set.model_dir() + "/unet/config.json"));
  pipeline::check_controlnet_fits(net->controlnet_config(), unet, 8, "cn");
  auto other = unet;
  other.layers_per_block = std::vector<int64_t>(unet.layers_per_block.size(), 1);
  const auto msg = test::expect_throw<InvalidArgument>(
      [&] { pipeline::check_controlnet_fits(net->controlnet_config(), other, 8, "cn"); });
  EXPECT_NE(msg.find("layers_per_block is [2, 2, 2, 2], the UNet's [1, 1, 1, 1]"),
            std::string::npos)
      << msg;
  EXPECT_THROW(pipeline::check_controlnet_fits(net->controlnet_config(), unet, 16, "cn"),
               InvalidArgument);
  // Not a folder, a folder without config.json.
  test::TempDir dir;
  EXPECT_THROW(models::load_controlnet(dir.file("missing"), torch::kCPU, torch::kFloat32), IoError);
  EXPECT_THROW(models::load_controlnet(dir.path().string(), torch::kCPU, torch::kFloat32), IoError);
}

// The golden ControlNet folder written as an original single-file checkpoint (control_model.*
// keys, cldm's numbering), by this test's own table (the inverse of io/ldm_key_map's).
std::string write_original_controlnet(const std::string& folder, const test::TempDir& dir) {
  using Table = std::vector<std::pair<std::string, std::string>>;
  const auto w = io::load_weights_file(folder + "/diffusion_pytorch_model.safetensors");
  const auto cfg = io::JsonConfig::load(folder + "/config.json").json();
  const int n = cfg["layers_per_block"].get<int>();
  const size_t levels = cfg["block_out_channels"].size();
  const std::string p = "control_model.";
  std::map<std::string, torch::Tensor> out;
  const auto move = [&](const std::string& from, const std::string& to,
                        const Table& table = {{"", ""}}) {
    for (auto it = w.lower_bound(from); it != w.end() && it->first.rfind(from, 0) == 0; ++it) {
      const std::string rest = it->first.substr(from.size());
      for (const auto& [d, l] : table)
        if (rest.rfind(d, 0) == 0) {
          out[to + l + rest.substr(d.size())] = it->second;
          break;
        }
    }
  };
  const Table resnet = {
      {"norm1.", "in_layers.0."},          {"conv1.", "in_layers.2."},
      {"time_emb_proj.", "emb_layers.1."}, {"norm2.", "out_layers.0."},
      {"conv2.", "out_layers.3."},         {"conv_shortcut.", "skip_connection."}};
  move("time_embedding.linear_1.", p + "time_embed.0.");
  move("time_embedding.linear_2.", p + "time_embed.2.");
  move("conv_in.", p + "input_blocks.0.0.");
  for (size_t l = 0; l < levels; ++l) {
    const std::string d = "down_blocks." + std::to_string(l) + ".";
    for (int r = 0; r < n; ++r) {
      const std::string entry = p + "input_blocks." + std::to_string(1 + l * (n + 1) + r) + ".";
      move(d + "resnets." + std::to_string(r) + ".", entry + "0.", resnet);
      move(d + "attentions." + std::to_string(r) + ".", entry + "1.");
    }
    move(d + "downsamplers.0.conv.",
         p + "input_blocks." + std::to_string(1 + l * (n + 1) + n) + ".0.op.");
  }
  move("mid_block.resnets.0.", p + "middle_block.0.", resnet);
  move("mid_block.attentions.0.", p + "middle_block.1.");
  move("mid_block.resnets.1.", p + "middle_block.2.", resnet);
  move("controlnet_cond_embedding.conv_in.", p + "input_hint_block.0.");
  const size_t blocks = 2 * (cfg["conditioning_embedding_out_channels"].size() - 1);
  for (size_t b = 0; b < blocks; ++b)
    move("controlnet_cond_embedding.blocks." + std::to_string(b) + ".",
         p + "input_hint_block." + std::to_string(2 + 2 * b) + ".");
  move("controlnet_cond_embedding.conv_out.",
       p + "input_hint_block." + std::to_string(2 + 2 * blocks) + ".");
  for (size_t i = 0; i < w.size(); ++i)
    move("controlnet_down_blocks." + std::to_string(i) + ".",
         p + "zero_convs." + std::to_string(i) + ".0.");
  move("controlnet_mid_block.", p + "middle_block_out.0.");
  EXPECT_EQ(out.size(), w.size()) << "the test's table left tensors out";
  const auto file = dir.file("control_v11p_tiny.safetensors");
  io::save_safetensors(file, {out.begin(), out.end()});
  return file;
}

TEST(ControlNet, AnOriginalSingleFileCheckpointLoadsAsItsDiffusersFolder) {
  if (!have(control_dir())) GTEST_SKIP() << "no set at " << control_dir();
  const auto set = verify::GoldenSet::load(control_dir());
  const auto folder = set.model_dir() + "/controlnet";
  test::TempDir dir;
  const auto file = write_original_controlnet(folder, dir);
  const auto unet = models::UNet2DConditionConfig::from_json(
      io::JsonConfig::load(set.model_dir() + "/unet/config.json"));
  auto a = models::load_controlnet(folder, torch::kCPU, torch::kFloat32);
  auto b = models::load_controlnet(file, torch::kCPU, torch::kFloat32, &unet);
  const int64_t f = a->controlnet_config().condition_factor();
  auto gen = at::detail::createCPUGenerator(11);
  const auto sample = torch::randn({2, 4, 4, 6}, gen);
  const auto ctx = torch::randn({2, 5, unet.cross_attention_dim[0]}, gen);
  const auto cond = torch::rand({2, 3, 4 * f, 6 * f}, gen);
  const auto ra = a->forward(sample, torch::tensor(500), ctx, cond, 0.8, false);
  const auto rb = b->forward(sample, torch::tensor(500), ctx, cond, 0.8, false);
  ASSERT_EQ(ra.down.size(), rb.down.size());
  for (size_t i = 0; i < ra.down.size(); ++i)
    EXPECT_TRUE(torch::equal(ra.down[i], rb.down[i])) << i;
  EXPECT_TRUE(torch::equal(ra.mid, rb.mid));
  // Without the UNet it steers there is no configuration; with another one it does not fit.
  EXPECT_THROW(models::load_controlnet(file, torch::kCPU, torch::kFloat32), InvalidArgument);
  auto other = unet;
  other.layers_per_block = std::vector<int64_t>(unet.layers_per_block.size(), 1);
  EXPECT_NE(test::expect_throw<InvalidArgument>([&] {
              models::load_controlnet(file, torch::kCPU, torch::kFloat32, &other);
            }).find("another base model"),
            std::string::npos);
}

TEST(ControlNet, UnitsAreCheckedBeforeAnythingLoads) {
  ControlNetUnit u;
  u.model = "cn";
  EXPECT_THROW(pipeline::validate_controlnet_units({u}), InvalidArgument);  // no image
  u.image = torch::zeros({8, 8, 3}, torch::kUInt8);
  pipeline::validate_controlnet_units({u});
  u.start = 0.7;
  u.end = 0.2;
  EXPECT_THROW(pipeline::validate_controlnet_units({u}), InvalidArgument);
  u.start = 0;
  u.end = 1;
  u.preprocess = "blur";
  EXPECT_THROW(pipeline::validate_controlnet_units({u}), InvalidArgument);
}

TEST(ControlNetCli, RunsAndRefusesMismatchedFlags) {
  if (!have(control_dir())) GTEST_SKIP() << "no set at " << control_dir();
  const auto set = verify::GoldenSet::load(control_dir());
  test::TempDir dir;
  Image control;
  control.width = 48;
  control.height = 40;
  control.rgb.assign(static_cast<size_t>(48) * 40 * 3, 0);
  for (int y = 10; y < 30; ++y)
    for (int x = 12; x < 36; ++x)
      for (int c = 0; c < 3; ++c) control.rgb[(static_cast<size_t>(y) * 48 + x) * 3 + c] = 255;
  write_png(dir.file("control.png"), control);
  const std::string model = set.model_dir();
  auto ok = test::run_cli({"txt2img",
                           "-m",
                           model,
                           "-p",
                           "a house",
                           "--steps",
                           "2",
                           "-W",
                           "64",
                           "-H",
                           "64",
                           "--controlnet",
                           model + "/controlnet",
                           "--control-image",
                           dir.file("control.png"),
                           "--control-preprocess",
                           "canny",
                           "-o",
                           dir.file("out.png"),
                           "-q"},
                          dir);
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
  EXPECT_TRUE(fs::exists(dir.file("out.png")));
  // The plan counts the ControlNet's weights.
  ok = test::run_cli({"txt2img", "-m", model, "-p", "a house", "--steps", "1", "-W", "64", "-H",
                      "64", "--controlnet", model + "/controlnet", "--control-image",
                      dir.file("control.png"), "--json", "-o", dir.file("out2.png")},
                     dir);
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
  EXPECT_NE(ok.out.find("ControlNet"), std::string::npos) << ok.out;
  EXPECT_NE(ok.out.find("held throughout"), std::string::npos) << ok.out;
  auto r = test::run_cli({"txt2img", "-m", model, "-p", "a house", "--controlnet",
                          model + "/controlnet", "-o", dir.file("bad.png")},
                         dir);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("one control image per ControlNet"), std::string::npos) << r.err;
  r = test::run_cli(
      {"txt2img", "-m", model, "-p", "a house", "--guess-mode", "-o", dir.file("bad.png")}, dir);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("need a --controlnet"), std::string::npos) << r.err;
  r = test::run_cli(
      {"txt2img", "-m", model, "-p", "a house", "--controlnet", model + "/controlnet",
       "--control-image", dir.file("control.png"), "--deepcache", "2", "-o", dir.file("bad.png")},
      dir);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("DeepCache"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(dir.file("bad.png")));
}

TEST(InpaintCli, MaskFlagsWorkAndAreRefusedWithoutAMask) {
  if (!have(inpaint_dir())) GTEST_SKIP() << "no set at " << inpaint_dir();
  const auto set = verify::GoldenSet::load(inpaint_dir());
  test::TempDir dir;
  const auto s = scene(64, 64);
  write_png(dir.file("src.png"), s.source);
  Image mask;
  mask.width = mask.height = 64;
  for (int64_t i = 0; i < 64 * 64; ++i)
    for (int c = 0; c < 3; ++c) mask.rgb.push_back(s.mask.view({-1})[i].item<uint8_t>());
  write_png(dir.file("mask.png"), mask);
  auto ok = test::run_cli({"img2img",
                           "-m",
                           set.model_dir(),
                           "-i",
                           dir.file("src.png"),
                           "--mask",
                           dir.file("mask.png"),
                           "--mask-crop",
                           "8",
                           "--mask-blur",
                           "1",
                           "-p",
                           "a cat",
                           "--steps",
                           "2",
                           "--strength",
                           "1",
                           "-o",
                           dir.file("out.png"),
                           "-q"},
                          dir);
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
  EXPECT_TRUE(fs::exists(dir.file("out.png")));
  auto r = test::run_cli({"img2img", "-m", set.model_dir(), "-i", dir.file("src.png"),
                          "--invert-mask", "-p", "a cat", "-o", dir.file("bad.png")},
                         dir);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("give one"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(dir.file("bad.png")));
}

// ---- server ------------------------------------------------------------------------------------

using nlohmann::json;

std::string base64_png(const Image& img) {
  return server::base64_encode(encode_png(img));
}

// A w x h picture and a mask (white rectangle in the middle) as images.
std::pair<Image, Image> picture_and_mask(int w, int h) {
  const auto s = scene(h, w);
  Image mask;
  mask.width = w;
  mask.height = h;
  for (int64_t i = 0; i < int64_t{w} * h; ++i)
    for (int c = 0; c < 3; ++c) mask.rgb.push_back(s.mask.view({-1})[i].item<uint8_t>());
  return {s.source, mask};
}

// An RGBA PNG whose alpha is 0 inside the rectangle [x0, x1) x [y0, y1): OpenAI's edit mask.
std::string rgba_mask_png(int w, int h, int x0, int y0, int x1, int y1) {
  std::string out;
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, nullptr, nullptr, nullptr);
  png_infop info = png_create_info_struct(png);
  png_set_write_fn(
      png, &out,
      [](png_structp p, png_bytep data, png_size_t n) {
        static_cast<std::string*>(png_get_io_ptr(p))->append(reinterpret_cast<char*>(data), n);
      },
      nullptr);
  png_set_IHDR(png, info, w, h, 8, PNG_COLOR_TYPE_RGBA, PNG_INTERLACE_NONE,
               PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
  png_write_info(png, info);
  std::vector<uint8_t> row(static_cast<size_t>(w) * 4);
  for (int y = 0; y < h; ++y) {
    for (int x = 0; x < w; ++x) {
      const bool hole = x >= x0 && x < x1 && y >= y0 && y < y1;
      row[x * 4] = row[x * 4 + 1] = row[x * 4 + 2] = 90;
      row[x * 4 + 3] = hole ? 0 : 255;
    }
    png_write_row(png, row.data());
  }
  png_write_end(png, info);
  png_destroy_write_struct(&png, &info);
  return out;
}

TEST(InpaintServer, A1111OnlyMaskedKeepsTheRestAndRefusesAnAllBlackMask) {
  test::TestServer server;
  auto c = server.client();
  const auto [picture, mask] = picture_and_mask(64, 64);
  auto r = c->Post("/sdapi/v1/img2img",
                   json{{"prompt", "a red circle"},
                        {"steps", 3},
                        {"seed", 3},
                        {"denoising_strength", 1.0},
                        {"init_images", {base64_png(picture)}},
                        {"mask", base64_png(mask)},
                        {"mask_blur", 0},
                        {"inpainting_fill", 1},
                        {"inpaint_full_res", true},
                        {"inpaint_full_res_padding", 4}}
                       .dump(),
                   "application/json");
  ASSERT_EQ(r->status, 200) << r->body;
  const auto out =
      decode_png(server::base64_decode(test::json_of(r)["images"][0].get<std::string>(), "image"),
                 "image", 1 << 20);
  ASSERT_EQ(out.width, 64);
  int64_t changed_outside = 0, changed_inside = 0;
  for (size_t i = 0; i < out.rgb.size(); ++i) {
    const bool repaint = mask.rgb[i] != 0;
    (repaint ? changed_inside : changed_outside) += out.rgb[i] != picture.rgb[i];
  }
  EXPECT_EQ(changed_outside, 0);
  EXPECT_GT(changed_inside, 0);

  Image black = mask;
  std::fill(black.rgb.begin(), black.rgb.end(), 0);
  test::expect_error(
      c->Post(
          "/sdapi/v1/img2img",
          json{{"prompt", "x"}, {"init_images", {base64_png(picture)}}, {"mask", base64_png(black)}}
              .dump(),
          "application/json"),
      400, "all black");
  test::expect_error(c->Post("/v1/jobs", json{{"prompt", "x"}, {"mask", base64_png(mask)}}.dump(),
                             "application/json"),
                     400, "img2img and edit jobs");
  test::expect_error(c->Post("/v1/jobs",
                             json{{"prompt", "x"},
                                  {"init_image", base64_png(picture)},
                                  {"mask", base64_png(mask)},
                                  {"inpaint_fill", "smudge"}}
                                 .dump(),
                             "application/json"),
                     400, "inpaint_fill");
}

TEST(InpaintServer, OpenAiMaskRepaintsItsTransparentPixels) {
  test::TestServer server;
  auto c = server.client();
  const auto [picture, unused] = picture_and_mask(64, 64);
  httplib::MultipartFormDataItems items = {
      {"image", encode_png(picture), "in.png", "image/png"},
      {"mask", rgba_mask_png(64, 64, 16, 16, 40, 40), "mask.png", "image/png"},
      {"prompt", "a blue square", "", ""},
      {"strength", "1", "", ""}};
  auto r = c->Post("/v1/images/edits", items);
  ASSERT_EQ(r->status, 200) << r->body;
  // A mask without a transparent pixel repaints nothing; one of another size does not fit.
  items[1] = {"mask", rgba_mask_png(64, 64, 0, 0, 0, 0), "mask.png", "image/png"};
  test::expect_error(c->Post("/v1/images/edits", items), 400, "no fully transparent pixel");
  items[1] = {"mask", rgba_mask_png(32, 32, 0, 0, 8, 8), "mask.png", "image/png"};
  test::expect_error(c->Post("/v1/images/edits", items), 400, "the same size");
}

TEST(ControlNetServer, NamesComeFromTheControlNetDirectoryOnly) {
  test::TempDir dir;
  fs::create_directories(dir.path() / "canny");
  std::ofstream(dir.path() / "canny" / "config.json") << "{}";
  fs::create_directories(dir.path() / "not-a-net");
  server::ServerOptions options;
  options.controlnet_dir = dir.path().string();
  test::TestServer server(options);
  auto c = server.client();
  EXPECT_EQ(test::json_of(c->Get("/controlnet/model_list"))["model_list"], json({"canny"}));
  EXPECT_EQ(test::json_of(c->Get("/v1/status"))["controlnets"], json({"canny"}));
  const auto [picture, mask] = picture_and_mask(64, 64);
  test::expect_error(
      c->Post("/v1/jobs",
              json{{"prompt", "x"},
                   {"controlnets", {{{"model", "../etc"}, {"image", base64_png(picture)}}}}}
                  .dump(),
              "application/json"),
      400, "no ControlNet named '../etc' (available: canny)");
  test::expect_error(c->Post("/sdapi/v1/txt2img",
                             json{{"prompt", "x"},
                                  {"alwayson_scripts",
                                   {{"controlnet",
                                     {{"args",
                                       {{{"model", "canny [abc123]"},
                                         {"image", base64_png(picture)},
                                         {"module", "depth_midas"}}}}}}}}}
                                 .dump(),
                             "application/json"),
                     400, "not available (none or canny)");
  test::TestServer without;
  test::expect_error(
      without.client()->Post(
          "/v1/jobs",
          json{{"prompt", "x"}, {"controlnets", {{{"model", "canny"}, {"image", "x"}}}}}.dump(),
          "application/json"),
      400, "--controlnet-dir");
}

TEST(ParallelServerWire, MasksAndControlNetsTravelToTheOtherRanks) {
  server::JobRequest r;
  r.kind = server::JobKind::img2img;
  r.config.prompts = {"p"};
  r.config.inpaint.mask = torch::randint(0, 256, {5, 7}, torch::kInt64).to(torch::kUInt8);
  r.config.inpaint.blur = 2.5;
  r.config.inpaint.invert = true;
  r.config.inpaint.crop_padding = 12;
  r.config.inpaint.fill = "latent_noise";
  ControlNetUnit u;
  u.model = "/nets/canny";
  u.image = torch::randint(0, 256, {4, 6, 3}, torch::kInt64).to(torch::kUInt8);
  u.scale = 0.7;
  u.start = 0.1;
  u.end = 0.9;
  u.preprocess = "canny:50:150";
  r.config.controlnets = {u};
  r.config.guess_mode = true;
  const auto back = server::decode_job(server::encode_job(r));
  const auto& m = back.config.inpaint;
  EXPECT_TRUE(torch::equal(m.mask, r.config.inpaint.mask));
  EXPECT_EQ(m.blur, 2.5);
  EXPECT_TRUE(m.invert);
  EXPECT_EQ(m.crop_padding, 12);
  EXPECT_EQ(m.fill, "latent_noise");
  ASSERT_EQ(back.config.controlnets.size(), 1u);
  const auto& b = back.config.controlnets[0];
  EXPECT_EQ(b.model, u.model);
  EXPECT_TRUE(torch::equal(b.image, u.image));
  EXPECT_EQ(b.scale, 0.7);
  EXPECT_EQ(b.start, 0.1);
  EXPECT_EQ(b.end, 0.9);
  EXPECT_EQ(b.preprocess, u.preprocess);
  EXPECT_TRUE(back.config.guess_mode);
}

}  // namespace test_inpaint_controlnet
}  // namespace diffuse
