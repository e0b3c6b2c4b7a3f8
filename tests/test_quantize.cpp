// `diffuse quantize` on the golden model: a q8_0 GGUF of the UNet, put in a component folder in
// place of its safetensors, loads through the normal path and runs within q8_0's error of the
// original; the file holds what the reference quantizer makes of each weight; bad requests are
// refused before anything is read.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstring>
#include <filesystem>

#include "diffuse/errors.h"
#include "io/gguf.h"
#include "io/model_folder.h"
#include "models/unet2d_condition.h"
#include "quant/quantize_model.h"
#include "test_util.h"

namespace diffuse {
namespace test_quantize {

namespace fs = std::filesystem;

TEST(Quantize, AQ8UnetInItsFolderRunsLikeTheOriginal) {
  const std::string golden = test::golden_model_dir();
  test::TempDir dir;
  quant::QuantizeOptions o;
  o.model = golden;
  o.type = "q8_0";
  o.out = dir.file("unet-q8_0.gguf");
  const auto r = quant::quantize_model(o);
  EXPECT_EQ(r.component, "unet");
  if (r.quantized == 0) GTEST_SKIP() << "this model has no matrix with rows of whole q8_0 blocks";
  EXPECT_LT(r.quantized, r.tensors);  // biases and norms stay float
  EXPECT_LT(r.bytes_out, r.bytes_in);

  // A copy of the model whose unet/ holds the GGUF instead of its safetensors.
  const fs::path copy = dir.path() / "model";
  fs::copy(golden, copy, fs::copy_options::recursive);
  for (const auto& e : fs::directory_iterator(copy / "unet"))
    if (e.path().extension() == ".safetensors") fs::remove(e.path());
  fs::copy_file(o.out, copy / "unet" / "diffusion_pytorch_model.gguf");

  const auto original_folder = io::ModelFolder::open(golden);
  const auto q8_folder = io::ModelFolder::open(copy.string());
  const auto original_weights = original_folder.component_weights("unet");
  const auto q8_weights = q8_folder.component_weights("unet");
  ASSERT_EQ(q8_weights.size(), original_weights.size());
  const auto file = io::GgufFile::open(o.out);
  for (const auto& [name, w] : original_weights) {
    const auto& info = file->info(name);
    if (info.type != quant::GgmlType::Q8_0) {
      EXPECT_TRUE(torch::equal(q8_weights.at(name), w)) << name;
      continue;
    }
    // The file's blocks are the reference quantizer's, bit for bit.
    const auto src = w.to(torch::kFloat32).contiguous();
    std::vector<uint8_t> q(static_cast<size_t>(quant::ggml_row_bytes(info.type, src.numel())));
    quant::quantize(info.type, src.data_ptr<float>(), q.data(), src.numel());
    EXPECT_EQ(std::memcmp(q.data(), file->data(name), q.size()), 0) << name;
  }

  torch::NoGradGuard no_grad;
  const auto cpu = torch::Device(torch::kCPU);
  auto original = models::load_unet(original_folder, cpu, torch::kFloat32);
  auto q8 = models::load_unet(q8_folder, cpu, torch::kFloat32);
  torch::manual_seed(1);
  const auto cfg = original_folder.component_config("unet");
  const int64_t channels = cfg.get<int64_t>("in_channels", 4);
  const int64_t context = cfg.get<int64_t>("cross_attention_dim", 768);
  const auto x = torch::randn({1, channels, 16, 16});
  const auto t = torch::tensor({500}, torch::kInt64);
  const auto c = torch::randn({1, 7, context});
  const auto a = original->forward(x, t, c), b = q8->forward(x, t, c);
  // q8_0 moves each weight by at most half a step of 1/127 of its block's largest magnitude:
  // well under 5 % of the output's scale, while a wrong dequantization is of order 100 %.
  const double rel = ((a - b).norm() / a.norm()).item<double>();
  EXPECT_GT(rel, 0.0);
  EXPECT_LT(rel, 0.05);
}

TEST(Quantize, BadRequestsAreRefusedBeforeReading) {
  test::TempDir dir;
  quant::QuantizeOptions o;
  o.model = test::golden_model_dir();
  o.out = dir.file("x.gguf");
  o.type = "q6_k";
  EXPECT_NE(test::expect_throw<InvalidArgument>([&] {
              quant::quantize_model(o);
            }).find("--type 'q6_k' cannot be written"),
            std::string::npos);
  o.type = "q8_0";
  o.out = dir.file("x.safetensors");
  EXPECT_THROW(quant::quantize_model(o), InvalidArgument);
  o.out = dir.file("x.gguf");
  o.model = dir.file("nothing");
  EXPECT_THROW(quant::quantize_model(o), IoError);
  o.model = test::golden_model_dir();
  o.component = "nonexistent";
  EXPECT_THROW(quant::quantize_model(o), IoError);
  EXPECT_FALSE(fs::exists(dir.file("x.gguf")));
}

}  // namespace test_quantize
}  // namespace diffuse
