// Weights kept quantized in memory (quant/quantized_weight.h, nn::LinearImpl::quantized): the
// blocks dequantize bit for bit as ggml's reference does, a quantized layer computes with those
// values, its plain weight's memory is given up, and the demo model still draws what it is
// asked at q8_0.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <limits>

#include "diffuse/errors.h"
#include "diffuse/pipeline.h"
#include "io/model_folder.h"
#include "nn/layers.h"
#include "pipeline/hidream.h"
#include "pipeline_test_util.h"
#include "quant/dequantize_ops.h"
#include "quant/ggml_blocks.h"
#include "quant/quantize_model.h"
#include "quant/quantized_weight.h"
#include "test_util.h"
#include "train/scene.h"
#include "train/scene_scorer.h"
#include "verify/verify.h"

namespace diffuse {
namespace test_quantized_weights {

using quant::GgmlType;

// ggml's reference dequantizer, row by row, on the CPU.
torch::Tensor reference_dequantized(const quant::QuantizedWeight& q) {
  auto out = torch::empty({q.rows, q.cols});
  const auto blocks = q.blocks.to(torch::kCPU).contiguous();
  for (int64_t r = 0; r < q.rows; ++r)
    quant::dequantize(q.type, blocks.data_ptr<uint8_t>() + r * blocks.size(1),
                      out.data_ptr<float>() + r * q.cols, q.cols);
  return out;
}

bool same_bits(const torch::Tensor& a, const torch::Tensor& b) {
  return a.sizes() == b.sizes() &&
         torch::equal(a.contiguous().view(torch::kInt), b.contiguous().view(torch::kInt));
}

TEST(QuantizedWeights, DequantizeBitForBitAsGgmlsReference) {
  torch::manual_seed(3);
  // Rows of very different scales, a zero row and a row of one repeated value.
  auto w = torch::randn({6, 96}) * torch::tensor({1e-3, 0.1, 1.0, 30.0, 0.0, 1.0}).view({6, 1});
  w[5].fill_(-0.75);
  for (auto type : {GgmlType::Q8_0, GgmlType::Q4_0}) {
    const auto q = quant::quantize_weight(w, type, "w");
    EXPECT_EQ(q.bytes(), 6 * quant::ggml_row_bytes(type, 96));
    EXPECT_TRUE(same_bits(quant::dequantize_weight(q, torch::kFloat32), reference_dequantized(q)))
        << quant::ggml_type_traits(type).name;
    // Another dtype is the float32 values rounded once; the accelerators' path (tensor
    // operations) gives the CPU kernel's bits.
    for (auto dtype : {torch::kFloat32, torch::kBFloat16, torch::kFloat16}) {
      const auto cpu = quant::dequantize_weight(q, dtype);
      EXPECT_TRUE(torch::equal(cpu, reference_dequantized(q).to(dtype))) << dtype;
      EXPECT_TRUE(torch::equal(cpu, quant::dequantize_by_tensor_ops(q, dtype))) << dtype;
    }
  }
}

TEST(QuantizedWeights, PerCallDequantizationReusesOneBufferAndGivesTheSameValues) {
  torch::manual_seed(5);
  const auto big = quant::quantize_weight(torch::randn({8, 128}), GgmlType::Q8_0, "big");
  const auto small = quant::quantize_weight(torch::randn({3, 64}), GgmlType::Q4_0, "small");
  const auto a = quant::dequantize_weight_for_call(big, torch::kBFloat16);
  EXPECT_TRUE(torch::equal(a, quant::dequantize_weight(big, torch::kBFloat16)));
  const void* first = a.data_ptr();
  // A smaller weight lands in the same memory, with its own values and shape.
  const auto b = quant::dequantize_weight_for_call(small, torch::kFloat32);
  EXPECT_EQ(b.sizes(), torch::IntArrayRef({3, 64}));
  EXPECT_EQ(b.data_ptr(), first);
  EXPECT_TRUE(torch::equal(b, quant::dequantize_weight(small, torch::kFloat32)));
  // Int8 rows too, bit for bit as the tensor operations compute them.
  const auto rows = quant::quantize_weight(torch::randn({4, 64}), GgmlType::I8_ROWS, "rows");
  for (auto dtype : {torch::kFloat32, torch::kBFloat16, torch::kFloat16}) {
    const auto c = quant::dequantize_weight_for_call(rows, dtype);
    EXPECT_EQ(c.data_ptr(), first);
    EXPECT_TRUE(torch::equal(c, quant::dequantize_by_tensor_ops(rows, dtype))) << dtype;
    EXPECT_TRUE(torch::equal(c, quant::dequantize_weight(rows, dtype))) << dtype;
  }
}

TEST(QuantizedWeights, FileBlocksOfOtherTypesDequantizeOnTheCpu) {
  // A Q6_K matrix as a GGUF file would hold it: random bytes with sane fp16 scales.
  const auto& t = quant::ggml_type_traits(GgmlType::Q6_K);
  const int64_t rows = 3, cols = 2 * t.block_elems;
  auto bytes = torch::randint(0, 256, {rows * cols / t.block_elems, t.block_bytes}, torch::kByte);
  const auto scale = torch::full({bytes.size(0), 1}, 0.01, torch::kHalf);
  bytes.narrow(1, t.block_bytes - 2, 2).copy_(scale.view(torch::kByte));
  const auto q = quant::quantized_from_blocks(bytes.flatten(), GgmlType::Q6_K, rows, cols, "x");
  EXPECT_TRUE(same_bits(quant::dequantize_weight(q, torch::kFloat32), reference_dequantized(q)));
  const auto msg = test::expect_throw<FormatError>([&] {
    quant::quantized_from_blocks(bytes.flatten().narrow(0, 0, 10), GgmlType::Q6_K, rows, cols,
                                 "blk.0.w");
  });
  EXPECT_NE(msg.find("blk.0.w"), std::string::npos) << msg;
}

TEST(QuantizedWeights, LayerComputesWithTheDequantizedWeightAndGivesUpThePlainOne) {
  torch::manual_seed(5);
  nn::Linear layer = nn::make_linear(64, 40);
  const auto plain = layer->weight.detach().clone();
  const auto x = torch::randn({7, 64});
  torch::NoGradGuard no_grad;
  const auto y_plain = layer(x);
  auto q = quant::quantize_weight(layer->weight, GgmlType::Q8_0, "layer.weight");
  const auto deq = quant::dequantize_weight(q, torch::kFloat32);
  layer->keep_quantized(std::move(q));
  // Shape, dtype and device as before; the plain values are gone (one element's storage).
  EXPECT_EQ(layer->weight.sizes(), plain.sizes());
  EXPECT_EQ(layer->weight.scalar_type(), torch::kFloat32);
  EXPECT_LE(layer->weight.storage().nbytes(), 4u);
  EXPECT_EQ(nn::quantized_weight_bytes(*layer), 40 * quant::ggml_row_bytes(GgmlType::Q8_0, 64));
  const auto y = layer(x);
  EXPECT_TRUE(torch::equal(y, torch::nn::functional::linear(x, deq, layer->bias)));
  // Off from the plain layer by at most what the weights' rounding explains.
  const auto bound =
      x.abs().to(torch::kFloat64).matmul((plain - deq).abs().to(torch::kFloat64).t());
  const double eps = std::numeric_limits<float>::epsilon();
  const auto err = (y - y_plain).abs().to(torch::kFloat64);
  const auto slack =
      256 * eps * (x.abs().matmul(plain.abs().t()) + layer->bias.abs()).to(torch::kFloat64);
  EXPECT_TRUE((err <= bound + slack).all().item<bool>());
  EXPECT_GT(err.max().item<double>(), 0.0);  // the weights did change
  // A write into the placeholder fails rather than going nowhere.
  EXPECT_ANY_THROW(layer->weight.add_(1.0));
}

// A quantized convolution computes with its dequantized weight: within the arithmetic's bound
// of a float64 convolution with those values, and within the quantization's own bound of the
// plain weight's output; a 4-channel input convolution (36 values a row) stays plain.
TEST(QuantizedWeights, ConvolutionsQuantizeWhereTheirRowsAreWholeBlocks) {
  torch::manual_seed(7);
  torch::nn::ModuleList convs;
  auto conv = nn::make_conv2d(torch::nn::Conv2dOptions(32, 8, 3).padding(1));
  auto conv_in = nn::make_conv2d(torch::nn::Conv2dOptions(4, 8, 3).padding(1));
  convs->push_back(conv);
  convs->push_back(conv_in);
  const auto plain_w = conv->weight.detach().clone();
  const auto x = torch::randn({2, 32, 12, 12});
  torch::NoGradGuard no_grad;
  const auto y_plain = conv(x);
  for (auto type : {GgmlType::Q8_0, GgmlType::Q4_0}) {
    auto c = nn::make_conv2d(torch::nn::Conv2dOptions(32, 8, 3).padding(1));
    c->weight.copy_(plain_w);
    c->bias.copy_(conv->bias);
    torch::nn::ModuleList both;
    both->push_back(c);
    both->push_back(nn::make_conv2d(torch::nn::Conv2dOptions(4, 8, 3).padding(1)));
    const auto r = nn::quantize_conv_layers(*both, type);
    EXPECT_EQ(r.layers, 1);
    EXPECT_EQ(r.kept_plain, 1);
    ASSERT_TRUE(c->quantized);
    EXPECT_EQ(nn::quantized_weight_bytes(*both), c->quantized->bytes());
    EXPECT_EQ(c->weight.storage().nbytes(), 4u);  // the plain weight is given up
    const auto deq = quant::dequantize_weight(*c->quantized, torch::kFloat32).view({8, 32, 3, 3});
    const auto y = c(x);
    const auto x64 = x.to(torch::kFloat64), b64 = c->bias.to(torch::kFloat64);
    const auto y64 = torch::conv2d(x64, deq.to(torch::kFloat64), b64, 1, 1);
    const auto magnitude = torch::conv2d(x64.abs(), deq.to(torch::kFloat64).abs(), b64.abs(), 1, 1);
    EXPECT_TRUE(((y.to(torch::kFloat64) - y64).abs() <= magnitude * 1e-4).all().item<bool>())
        << quant::ggml_type_traits(type).name;
    // Against the plain weight: no further than the rounding of the weights carries.
    const auto rounding = torch::conv2d(
        x64.abs(), (plain_w.to(torch::kFloat64) - deq.to(torch::kFloat64)).abs(), {}, 1, 1);
    EXPECT_TRUE(
        ((y - y_plain).abs().to(torch::kFloat64) <= rounding + magnitude * 1e-4).all().item<bool>())
        << quant::ggml_type_traits(type).name;
    EXPECT_GT((y - y_plain).abs().max().item<double>(), 0);  // the weights were quantized
    // A run-time low-rank update adds to the quantized convolution's output.
    c->low_rank.push_back({torch::randn({2, 32, 3, 3}) * 0.1, torch::randn({8, 2, 1, 1}), 0.5});
    const auto h = torch::conv2d(x, c->low_rank[0].down, {}, 1, 1);
    EXPECT_TRUE(torch::allclose(c(x), y + 0.5 * torch::conv2d(h, c->low_rank[0].up), 1e-4, 1e-4));
  }
}

TEST(QuantizedWeights, ModuleQuantizesTheLayersWhoseRowsAreWholeBlocks) {
  torch::nn::Sequential net(nn::make_linear(64, 32), nn::make_linear(32, 48),
                            nn::make_linear(48, 16));
  const auto r = nn::quantize_linear_layers(*net, GgmlType::Q4_0);
  EXPECT_EQ(r.layers, 2);      // 64 and 32 inputs
  EXPECT_EQ(r.kept_plain, 1);  // 48 inputs is not whole blocks of 32
  EXPECT_EQ(r.plain_bytes, (64 * 32 + 32 * 48) * 4);
  EXPECT_EQ(r.quantized_bytes, 32 * 2 * 18 + 48 * 1 * 18);
  // A second call leaves the quantized layers as they are.
  EXPECT_EQ(nn::quantize_linear_layers(*net, GgmlType::Q4_0).layers, 0);
  torch::NoGradGuard no_grad;
  EXPECT_EQ(net->forward(torch::randn({2, 64})).sizes(), (std::vector<int64_t>{2, 16}));
}

TEST(QuantizedWeights, WeightTypeFlagValues) {
  EXPECT_FALSE(quant::parse_weight_type("none", "--weights").has_value());
  EXPECT_EQ(*quant::parse_weight_type("q8_0", "--weights"), GgmlType::Q8_0);
  EXPECT_EQ(*quant::parse_weight_type("q4_0", "--weights"), GgmlType::Q4_0);
  EXPECT_EQ(*quant::parse_weight_type("int8", "--weights"), GgmlType::I8_ROWS);
  auto msg =
      test::expect_throw<InvalidArgument>([] { quant::parse_weight_type("fp8", "--weights"); });
  EXPECT_NE(msg.find("LibTorch"), std::string::npos) << msg;
  msg = test::expect_throw<InvalidArgument>([] { quant::parse_weight_type("q5_k", "--weights"); });
  EXPECT_NE(msg.find("--weights 'q5_k'"), std::string::npos) << msg;
}

// The trained SD demo model at q8_0 and at int8 (8-bit integer products where the CPU has
// VNNI): less weight memory, and the held-out prompts still drawn right (scored, not compared
// by pixels).
TEST(QuantizedWeights, DemoModelQuantizedDrawsTheAskedScene) {
  const std::string demo = std::string(DIFFUSE_SOURCE_DIR) + "/models/demo";
  auto plain = Text2Image::load(demo, test::fp32_cpu());
  const std::vector<std::string> prompts = {
      "a red circle on the left on a blue background",
      "a yellow square at the top and a purple triangle at the bottom on a white background",
  };
  for (const std::string weights : {"q8_0", "int8"}) {
    LoadOptions lo = test::fp32_cpu();
    lo.weights = weights;
    auto quantized = Text2Image::load(demo, lo);
    EXPECT_EQ(quantized.info().weights, weights);
    EXPECT_LT(quantized.info().weight_bytes, plain.info().weight_bytes);
    for (const auto& prompt : prompts) {
      GenerationConfig cfg;
      cfg.prompts = {prompt};
      cfg.steps = 20;
      cfg.seed = 0;
      const auto spec = *train::parse_caption(prompt);
      const auto a = train::score_scene(plain.generate(cfg).images[0], spec);
      const auto b = train::score_scene(quantized.generate(cfg).images[0], spec);
      EXPECT_TRUE(b.background) << weights << ", " << prompt << ": " << b.detected_background;
      int right_a = 0, right_b = 0;
      for (const auto& o : a.objects) right_a += o.colour_position ? 1 : 0;
      for (const auto& o : b.objects) right_b += o.colour_position ? 1 : 0;
      EXPECT_GE(right_b, right_a) << weights << ", " << prompt;
    }
  }
}

// A 2-step text-to-image run's pixels as float64.
torch::Tensor two_step_image(pipeline::HiDreamPipeline& pipe, const std::string& prompt,
                             uint64_t seed) {
  pipeline::HiDreamTextToImage t;
  t.prompt = prompt;
  t.sampling.steps = 2;
  t.sampling.seed = seed;
  return pipe.text_to_image(t).image.to(torch::kFloat64);
}

// HiDream's transformer at q8_0 (the golden set's tiny model): the layers whose rows are whole
// blocks are quantized, the image stays close to the plain one, and what cannot work with
// quantized weights (merging a LoRA, streaming the plain weights) is refused by name.
TEST(QuantizedWeights, HiDreamTransformerRunsQuantized) {
  const std::string model = test::hidream_golden_dir() + "/model";
  if (!std::filesystem::exists(model + "/model_index.json")) GTEST_SKIP() << "no " << model;
  const auto folder = io::ModelFolder::open(model);
  auto image = [&](const std::string& weights) {
    pipeline::HiDreamPipeline pipe(folder, torch::kCPU, torch::kFloat32);
    pipe.set_weight_type(weights);
    auto out = two_step_image(pipe, "a red circle", 3);
    if (weights != "none") {
      const auto& q = pipe.quantized_layers();
      EXPECT_EQ(q.layers + q.kept_plain, [&] {
        int n = 0;
        for (const auto& m : pipe.transformer()->modules())
          n += dynamic_cast<nn::LinearImpl*>(m.get()) ? 1 : 0;
        return n;
      }());
      EXPECT_LT(q.quantized_bytes, q.plain_bytes * 0.6);  // 34 bytes per 32 values
    }
    return out;
  };
  const auto plain = image("none"), q8 = image("q8_0");
  EXPECT_TRUE(torch::isfinite(q8).all().item<bool>());
  // Pixels in [0, 255]: q8_0's rounding moves them little.
  EXPECT_LT((q8 - plain).abs().mean().item<double>(), 8.0);

  pipeline::HiDreamPipeline pipe(folder, torch::kCPU, torch::kFloat32);
  pipe.set_weight_type("q8_0");
  auto msg = test::expect_throw<InvalidArgument>([&] { pipe.set_weight_streaming("on"); });
  EXPECT_NE(msg.find("quantized"), std::string::npos) << msg;
  msg =
      test::expect_throw<InvalidArgument>([&] { pipe.add_lora("/nonexistent.safetensors", 1.0); });
  EXPECT_NE(msg.find("--weights"), std::string::npos) << msg;
  pipeline::HiDreamPipeline streamed(folder, torch::kCPU, torch::kFloat32);
  streamed.set_weight_streaming("on");
  msg = test::expect_throw<InvalidArgument>([&] { streamed.set_weight_type("q4_0"); });
  EXPECT_NE(msg.find("streaming"), std::string::npos) << msg;
}

// `diffuse quantize` of the transformer, then the GGUF as --transformer FILE.gguf: its matrices
// stay in blocks (none widened), as many layers as --weights q8_0 keeps, and the same image up
// to the MoE gates (2-D tensors that GGUF stores in blocks and the load widens).
TEST(QuantizedWeights, HiDreamLoadsAQuantizedGgufTransformerAsBlocks) {
  const std::string model = test::hidream_golden_dir() + "/model";
  if (!std::filesystem::exists(model + "/model_index.json")) GTEST_SKIP() << "no " << model;
  test::TempDir dir;
  quant::QuantizeOptions qo;
  qo.model = model;
  qo.component = "transformer";
  qo.type = "q8_0";
  qo.out = dir.file("transformer-q8_0.gguf");
  quant::quantize_model(qo);
  auto run = [&](const std::string& transformer, const std::string& weights,
                 nn::QuantizedLayers* kept) {
    auto folder = io::ModelFolder::open(model);
    const auto component = io::use_transformer_weights(folder, transformer);
    pipeline::HiDreamPipeline pipe(folder, torch::kCPU, torch::kFloat32, component);
    pipe.set_weight_type(weights);
    auto out = two_step_image(pipe, "a blue square", 4);
    *kept = pipe.quantized_layers();
    return out;
  };
  nn::QuantizedLayers from_gguf, at_load;
  const auto a = run(qo.out, "none", &from_gguf);
  const auto b = run("transformer", "q8_0", &at_load);
  EXPECT_GT(from_gguf.layers, 0);
  EXPECT_EQ(from_gguf.layers, at_load.layers);
  EXPECT_EQ(from_gguf.quantized_bytes, at_load.quantized_bytes);
  EXPECT_LT((a - b).abs().mean().item<double>(), 2.0);
  // A missing file is named.
  auto folder = io::ModelFolder::open(model);
  const auto msg = test::expect_throw<IoError>(
      [&] { io::use_transformer_weights(folder, dir.file("missing.gguf")); });
  EXPECT_NE(msg.find("missing.gguf"), std::string::npos) << msg;
}

// Issue 39's check: the golden sets' denoiser cases verify after a q8_0 round trip of their
// linear weights within the stated tolerance (relative RMS error 5 %), every output and
// captured intermediate compared; and the round trip really moved the outputs (further than
// the float32 tolerance of 1e-4 somewhere), so the weights were quantized.
TEST(QuantizedWeights, GoldenDenoiserCasesVerifyAfterAQ8RoundTrip) {
  verify::VerifyOptions o;
  o.weights = quant::GgmlType::Q8_0;
  int sets = 0;
  for (const auto& dir : {test::golden_dir(), test::hidream_golden_dir(), test::flux_golden_dir(),
                          test::sdxl_golden_dir()}) {
    if (!std::filesystem::exists(dir + "/cases.json")) continue;
    const auto set = verify::GoldenSet::load(dir);
    const auto results = verify::run_all(set, o);
    double largest = 0;
    for (const auto& r : results) {
      EXPECT_TRUE(verify::quantizable_component(r.component)) << r.name;
      EXPECT_TRUE(r.passed) << dir << " " << r.name << ": " << r.reason;
      largest = std::max(largest, r.max_abs_err);
    }
    if (results.empty()) continue;
    ++sets;
    EXPECT_GT(largest, 1e-4) << dir << ": the outputs did not move; were the weights quantized?";
  }
  EXPECT_GT(sets, 0);
  o.weights = quant::GgmlType::Q4_K;  // no stated tolerance: refused before any case runs
  EXPECT_THROW(verify::run_all(verify::GoldenSet::load(test::golden_dir()), o), InvalidArgument);
}

}  // namespace test_quantized_weights
}  // namespace diffuse
