// A Stable Diffusion UNet in a file of its own (--unet FILE, io/unet_file.h). The golden set's
// single-file checkpoint holds the same UNet as its diffusers folder in the original LDM names,
// so its model.diffusion_model.* tensors written alone (with or without the prefix, as
// safetensors or as a quantized GGUF) must land on every parameter of the folder's UNet and draw
// the folder's image; files that are not that UNet are refused before anything runs.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>

#include "cli_run.h"
#include "diffuse/errors.h"
#include "diffuse/pipeline.h"
#include "io/gguf.h"
#include "io/model_folder.h"
#include "io/safetensors.h"
#include "io/string_affixes.h"
#include "io/unet_file.h"
#include "pipeline_test_util.h"
#include "test_util.h"

namespace diffuse {
namespace test_unet_file {

namespace fs = std::filesystem;
using TensorMap = std::map<std::string, torch::Tensor>;
using quant::GgmlType;

const std::string kUnetPrefix = "model.diffusion_model.";

class UnetFile : public ::testing::Test {
 protected:
  void SetUp() override {
    set_ = verify::GoldenSet::load(test::golden_dir());
    if (set_.single_file_checkpoint().empty())
      GTEST_SKIP() << "golden set has no single_file_checkpoint in cases.json";
  }

  // The checkpoint's UNet tensors, named as in the file (prefix included).
  TensorMap ldm_unet() const {
    auto f = io::SafetensorsFile::open(set_.single_file_checkpoint());
    TensorMap out;
    for (const auto& name : f->names())
      if (io::starts_with(name, kUnetPrefix)) out[name] = f->get(name);
    return out;
  }
  TensorMap folder_unet() const {
    return io::ModelFolder::open(set_.model_dir()).component_weights("unet");
  }
  // `tensors` as a safetensors file, with `strip` removed from the front of every name.
  std::string write_safetensors(const std::string& name, const TensorMap& tensors,
                                const std::string& strip = "") const {
    std::vector<std::pair<std::string, torch::Tensor>> list;
    for (const auto& [k, t] : tensors) list.emplace_back(k.substr(strip.size()), t);
    const std::string path = tmp_.file(name);
    io::save_safetensors(path, list);
    return path;
  }
  // The LDM UNet without its prefix as a GGUF, matrices with whole 32-value rows in q8_0 (as
  // stable-diffusion.cpp's and city96's converters write them), the rest in f32.
  std::string write_ldm_gguf_q8() const {
    std::vector<io::GgufTensorToWrite> tensors;
    for (const auto& [k, t] : ldm_unet()) {
      const bool q8 = t.dim() == 2 && t.size(1) % 32 == 0;
      tensors.push_back({k.substr(kUnetPrefix.size()), t, q8 ? GgmlType::Q8_0 : GgmlType::F32});
    }
    const std::string path = tmp_.file("unet-q8_0.gguf");
    io::write_gguf(path, {{"general.architecture", "sd"}}, tensors);
    return path;
  }

  Text2Image load(const std::string& unet_file, const std::string& weights = "none") const {
    LoadOptions o = test::fp32_cpu();
    o.unet_file = unet_file;
    o.weights = weights;
    return Text2Image::load(set_.model_dir(), o);
  }
  static torch::Tensor image(Text2Image& t2i) {
    GenerationConfig g;
    g.prompts = {"a red circle"};
    g.steps = 2;
    g.seed = 7;
    const auto result = t2i.generate(g);
    const auto& img = result.images.at(0);
    return torch::from_blob(const_cast<uint8_t*>(img.rgb.data()),
                            {static_cast<int64_t>(img.rgb.size())}, torch::kUInt8)
        .clone();
  }

  verify::GoldenSet set_;
  test::TempDir tmp_;
};

// Every parameter of the folder's UNet is found through the table, bit for bit the folder's,
// whether the file keeps the checkpoint's prefix or not.
TEST_F(UnetFile, LdmNamesReachEveryParameterOfTheFolderUnet) {
  const auto want = folder_unet();
  for (const std::string& strip : {std::string(), kUnetPrefix}) {
    const auto path = write_safetensors("unet.safetensors", ldm_unet(), strip);
    const auto file = io::open_unet_file(path);
    EXPECT_EQ(file.naming, "ldm");
    ASSERT_TRUE(file.layout.has_value());
    EXPECT_EQ(file.layout->size(), want.size())
        << "prefix '" << kUnetPrefix.substr(strip.size()) << "'";
    auto stored = io::SafetensorsFile::open(path);
    int64_t parameters = 0;
    for (const auto& [name, w] : want) {
      ASSERT_TRUE(file.layout->count(name)) << name;
      const auto& key = file.layout->at(name).key;
      EXPECT_TRUE(torch::equal(stored->get(key), w)) << name << " <- " << key;
      parameters += w.numel();
    }
    EXPECT_EQ(file.parameters, parameters);
  }
}

TEST_F(UnetFile, DiffusersNamedFileIsReadAsItIs) {
  const auto path = write_safetensors("unet.safetensors", folder_unet());
  const auto file = io::open_unet_file(path);
  EXPECT_EQ(file.naming, "diffusers");
  EXPECT_FALSE(file.layout.has_value());
}

// The LDM-named UNet draws the folder's image bit for bit; as a q8_0 GGUF its matrices stay in
// the file's blocks: with --weights q8_0 (which quantizes the convolutions as well) the image
// equals the folder's with that flag (the same blocks), and the UNet keeps fewer bytes than the
// plain one.
TEST_F(UnetFile, DrawsTheFolderImagePlainAndAsQuantizedGguf) {
  auto folder = Text2Image::load(set_.model_dir(), test::fp32_cpu());
  auto ldm = load(write_safetensors("unet.safetensors", ldm_unet()));
  const auto want = image(folder);
  EXPECT_TRUE(torch::equal(image(ldm), want));

  LoadOptions q8_options = test::fp32_cpu();
  q8_options.weights = "q8_0";
  auto folder_q8 = Text2Image::load(set_.model_dir(), q8_options);
  const auto gguf_path = write_ldm_gguf_q8();
  auto gguf = load(gguf_path);
  EXPECT_EQ(gguf.info().weights, "gguf");
  EXPECT_LT(gguf.info().weight_bytes, folder.info().weight_bytes);
  // --weights q8_0 quantizes the convolutions too, which the GGUF keeps as stored; with the
  // flag on the GGUF as well, the same blocks everywhere.
  EXPECT_GT(gguf.info().weight_bytes, folder_q8.info().weight_bytes);
  auto gguf_q8 = load(gguf_path, "q8_0");
  EXPECT_EQ(gguf_q8.info().weight_bytes, folder_q8.info().weight_bytes);
  const auto q8 = image(gguf_q8);
  EXPECT_TRUE(torch::equal(q8, image(folder_q8)));
  EXPECT_FALSE(torch::equal(image(gguf), want)) << "the GGUF's q8_0 blocks should move some pixel";
}

// stable-diffusion.cpp's all-in-one GGUF (the whole checkpoint, LDM names): its UNet's q8_0
// blocks are kept as stored too, not dequantized with the rest of the file. With only the UNet's
// matrices quantized, the image is the folder's with --weights q8_0.
TEST_F(UnetFile, AllInOneGgufKeepsItsUnetQuantized) {
  std::vector<io::GgufTensorToWrite> tensors;
  auto f = io::SafetensorsFile::open(set_.single_file_checkpoint());
  for (const auto& name : f->names()) {
    const auto t = f->get(name);
    const bool q8 = io::starts_with(name, kUnetPrefix) && t.dim() == 2 && t.size(1) % 32 == 0;
    tensors.push_back({name, t, q8 ? GgmlType::Q8_0 : GgmlType::F32});
  }
  const std::string path = tmp_.file("sd-q8_0.gguf");
  io::write_gguf(path, {{"general.architecture", "sd"}}, tensors);
  LoadOptions o = test::fp32_cpu();
  o.config_dir = set_.model_dir();
  auto gguf = Text2Image::load(path, o);
  EXPECT_EQ(gguf.info().weights, "gguf");
  LoadOptions q8_options = test::fp32_cpu();
  q8_options.weights = "q8_0";
  auto folder_q8 = Text2Image::load(set_.model_dir(), q8_options);
  // --weights q8_0 also quantizes the convolutions, which a GGUF keeps as stored (ggml's
  // blocks run along a 4-D tensor's kernel width): the same with --weights on the GGUF.
  EXPECT_GT(gguf.info().weight_bytes, folder_q8.info().weight_bytes);
  q8_options.config_dir = set_.model_dir();
  auto gguf_q8 = Text2Image::load(path, q8_options);
  EXPECT_EQ(gguf_q8.info().weight_bytes, folder_q8.info().weight_bytes);
  EXPECT_TRUE(torch::equal(image(gguf_q8), image(folder_q8)));
}

TEST_F(UnetFile, RefusesFilesThatAreNotTheFolderUnet) {
  auto message_of = [&](const std::string& path) {
    return test::expect_throw<Error>([&] { load(path); });
  };
  // Neither naming.
  auto msg = message_of(write_safetensors("other.safetensors", {{"w", torch::ones({2})}}));
  EXPECT_NE(msg.find("not a UNet file"), std::string::npos) << msg;
  // A whole checkpoint is a --model, not a --unet.
  msg = message_of(set_.single_file_checkpoint());
  EXPECT_NE(msg.find("outside the UNet"), std::string::npos) << msg;
  EXPECT_NE(msg.find("--model"), std::string::npos) << msg;
  // An LDM UNet with a tensor missing: named.
  auto unet = ldm_unet();
  unet.erase(kUnetPrefix + "middle_block.1.proj_in.weight");
  msg = message_of(write_safetensors("missing.safetensors", unet));
  EXPECT_NE(msg.find("middle_block.1.proj_in.weight"), std::string::npos) << msg;
  // A diffusers-named UNet with a tensor of the wrong shape: named at load.
  auto wrong = folder_unet();
  wrong["conv_in.weight"] = torch::zeros({1, 1, 3, 3});
  msg = message_of(write_safetensors("wrong.safetensors", wrong));
  EXPECT_NE(msg.find("conv_in.weight"), std::string::npos) << msg;
  // A folder whose config describes another UNet than the file's: the key and both values.
  const fs::path copy = tmp_.path() / "model";
  fs::copy(set_.model_dir(), copy, fs::copy_options::recursive);
  const auto config_path = copy / "unet" / "config.json";
  fs::permissions(config_path, fs::perms::owner_write, fs::perm_options::add);
  auto config = nlohmann::json::parse(test::read_file(config_path.string()));
  config["cross_attention_dim"] = config["cross_attention_dim"].get<int>() * 2;
  std::ofstream(config_path) << config.dump();
  LoadOptions o = test::fp32_cpu();
  o.unet_file = write_safetensors("unet.safetensors", ldm_unet());
  msg = test::expect_throw<ConfigError>([&] { Text2Image::load(copy.string(), o); });
  EXPECT_NE(msg.find("cross_attention_dim"), std::string::npos) << msg;
}

// The flags as a user types them: --unet on a Stable Diffusion folder, --transformer on a FLUX
// one (the README's line), each refused on the other family with the flag that fits.
TEST_F(UnetFile, CliTakesUnetForStableDiffusionAndTransformerForDits) {
  const auto unet = write_ldm_gguf_q8();
  const std::string out = tmp_.file("sd.png");
  auto r = test::run_cli({"txt2img", "-m", set_.model_dir(), "--unet", unet, "-p", "a red circle",
                          "--steps", "2", "-o", out, "--quiet"},
                         tmp_);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(fs::exists(out));

  const std::string flux = verify::GoldenSet::load(test::flux_golden_dir()).model_dir();
  if (!fs::exists(flux + "/model_index.json")) return;
  r = test::run_cli({"txt2img", "-m", flux, "--unet", unet, "-p", "a", "-o", tmp_.file("f.png")},
                    tmp_);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("--transformer FILE"), std::string::npos) << r.err;
  r = test::run_cli({"txt2img", "-m", set_.model_dir(), "--transformer", unet, "-p", "a", "-o",
                     tmp_.file("s.png")},
                    tmp_);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("--unet FILE"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(tmp_.file("s.png")));

  // FLUX's transformer given as its file draws what the folder draws.
  const std::string from_folder = tmp_.file("flux-folder.png"),
                    from_file = tmp_.file("flux-file.png");
  const std::vector<std::string> common = {"txt2img", "-m", flux,     "-p", "a red circle",
                                           "--steps", "2",  "--seed", "3",  "--quiet"};
  auto with = [&](std::vector<std::string> extra) {
    auto args = common;
    args.insert(args.end(), extra.begin(), extra.end());
    return test::run_cli(args, tmp_);
  };
  r = with({"-o", from_folder});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto weights = io::ModelFolder::open(flux).component_weights_path("transformer");
  r = with({"--transformer", weights, "-o", from_file});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(test::read_file(from_file), test::read_file(from_folder));
}

}  // namespace test_unet_file
}  // namespace diffuse
