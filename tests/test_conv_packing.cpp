// nn::Conv2d's packed weight copy (bf16 CPU convolutions below 32x32 pixels): the same
// results as the plain path, one copy of the weights (the packed one replaces the plain one),
// a copy that follows every write to the weight, and no copy where it does not apply.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "adapters/lora.h"
#include "adapters/lora_merger.h"
#include "device/cpu_info.h"
#include "io/lora_key_map.h"
#include "nn/layers.h"
#include "cpu_bf16.h"

using namespace diffuse;

namespace test_conv_packing {

// oneDNN's bf16 convolutions need AVX-512; elsewhere LibTorch refuses a packed weight and
// every layer keeps the plain path, which the equality checks still cover.
bool packing_expected() {
  return device::cpu_info().avx512f;
}

struct NetImpl : torch::nn::Module {
  explicit NetImpl(int64_t in = 64, int64_t out = 64) {
    conv_in = register_module("conv_in",
                              nn::make_conv2d(torch::nn::Conv2dOptions(in, out, 3).padding(1)));
    down = register_module(
        "down", nn::make_conv2d(torch::nn::Conv2dOptions(out, out, 3).stride(2).padding(1)));
    shortcut = register_module("shortcut", nn::make_conv2d(torch::nn::Conv2dOptions(out, out, 1)));
  }
  torch::Tensor forward(const torch::Tensor& x) { return shortcut(down(conv_in(x))); }
  nn::Conv2d conv_in{nullptr}, down{nullptr}, shortcut{nullptr};
};
TORCH_MODULE(Net);

Net bf16_net(uint64_t seed) {
  torch::manual_seed(seed);
  Net net;
  net->to(torch::kBFloat16);
  net->eval();
  return net;
}

torch::Tensor input(c10::IntArrayRef shape, uint64_t seed) {
  auto gen = at::detail::createCPUGenerator(seed);
  return torch::randn(shape, gen, torch::kFloat32).to(torch::kBFloat16);
}

// The same network's output with packing off (oneDNN reorders the plain weight per call).
torch::Tensor plain_output(Net& net, const torch::Tensor& x) {
  nn::set_weight_packing(*net, false);
  auto y = net->forward(x);
  nn::set_weight_packing(*net, true);
  return y;
}

TEST(ConvPacking, PackedConvolutionsGiveThePlainResultBitForBit) {
  DIFFUSE_SKIP_WITHOUT_CPU_BF16();
  torch::NoGradGuard no_grad;
  auto net = bf16_net(1);
  const auto x = input({2, 64, 12, 10}, 2);  // 3x3, a stride-2 3x3 and a 1x1 convolution
  const auto expected = plain_output(net, x);
  nn::set_weight_packing(*net, true);
  EXPECT_EQ(nn::packed_weight_bytes(*net), 0) << "packing happens at the first forward";
  const auto first = net->forward(x), second = net->forward(x);
  EXPECT_TRUE(torch::equal(first, expected));
  EXPECT_TRUE(torch::equal(second, expected));
  if (packing_expected()) {
    int64_t weights = 0;
    for (const auto& p : net->parameters())
      if (p.dim() == 4) weights += p.numel() * 2;
    EXPECT_GE(nn::packed_weight_bytes(*net), weights);
  }
  nn::set_weight_packing(*net, false);
  EXPECT_EQ(nn::packed_weight_bytes(*net), 0) << "turning packing off frees the copies";
}

TEST(ConvPacking, TheCopyFollowsInPlaceWritesAndReplacedWeights) {
  DIFFUSE_SKIP_WITHOUT_CPU_BF16();
  torch::NoGradGuard no_grad;
  auto net = bf16_net(3);
  const auto x = input({2, 64, 8, 8}, 4);
  nn::set_weight_packing(*net, true);
  net->forward(x);  // packs
  if (packing_expected()) {
    EXPECT_GT(net->conv_in->packed_bytes(), 0);
  }
  if (packing_expected()) {
    EXPECT_TRUE(net->conv_in->plain_weight_released());
    EXPECT_THROW(net->conv_in->weight.mul_(-0.5), c10::Error)
        << "a write that skips drop_packed_weights fails instead of going nowhere";
  }
  nn::drop_packed_weights(*net);  // writers give the plain weights back first
  net->conv_in->weight.mul_(-0.5);
  // (plain_output drops the copies: the packed result must come first.)
  const auto after_write = net->forward(x);
  EXPECT_TRUE(torch::equal(after_write, plain_output(net, x))) << "in-place write";
  net->forward(x);
  net->down->weight.set_data(torch::randn_like(net->down->weight));
  const auto after_replace = net->forward(x);
  EXPECT_TRUE(torch::equal(after_replace, plain_output(net, x))) << "replaced storage";
  // Swapped out, then back with other values: the new storage may take the freed address.
  net->forward(x);
  const auto negated = (net->down->weight * -1).contiguous();
  net->down->weight.set_data(torch::empty({0}, negated.options()));
  net->down->weight.set_data(negated.clone());
  const auto after_swap = net->forward(x);
  EXPECT_TRUE(torch::equal(after_swap, plain_output(net, x))) << "swapped out and back";
}

TEST(ConvPacking, InferenceTensorWritersDropTheCopies) {
  DIFFUSE_SKIP_WITHOUT_CPU_BF16();
  // Networks built under InferenceMode hold inference tensors, which count no versions.
  c10::InferenceMode inference;
  auto net = bf16_net(5);
  const auto x = input({1, 64, 8, 8}, 6);
  ASSERT_TRUE(net->conv_in->weight.is_inference());
  nn::set_weight_packing(*net, true);
  net->forward(x);
  nn::drop_packed_weights(*net);
  EXPECT_EQ(nn::packed_weight_bytes(*net), 0);
  net->conv_in->weight.add_(0.25);
  const auto after = net->forward(x);
  EXPECT_TRUE(torch::equal(after, plain_output(net, x)));
}

TEST(ConvPacking, MergedLoraReachesPackedConvolutions) {
  DIFFUSE_SKIP_WITHOUT_CPU_BF16();
  c10::InferenceMode inference;
  auto net = bf16_net(7);
  const auto x = input({1, 64, 8, 8}, 8);
  nn::set_weight_packing(*net, true);
  const auto before = net->forward(x);
  std::vector<adapters::Network> nets{{io::lora::unet_names(), net.get()}};
  std::map<std::string, torch::Tensor> t = {
      {"lora_unet_conv_in.lora_down.weight", torch::randn({2, 64, 3, 3})},
      {"lora_unet_conv_in.lora_up.weight", torch::randn({64, 2, 1, 1})}};
  adapters::LoraMerger merger(nets);
  const int id = merger.add(adapters::make_lora(t, {}, "kohya", nets), 1.0);
  const auto merged = net->forward(x);
  EXPECT_FALSE(torch::equal(merged, before));
  EXPECT_TRUE(torch::equal(merged, plain_output(net, x)));
  net->forward(x);  // packed again
  merger.remove(id);
  EXPECT_TRUE(torch::equal(net->forward(x), before)) << "the original weights are back";
}

// One copy of the weights, not two (issue 36: +0.9 GiB for SD2.1): the plain storage goes when
// the packed copy is made, and the exact values come back whenever the plain path needs them.
TEST(ConvPacking, ThePackedCopyReplacesThePlainWeight) {
  if (!packing_expected()) GTEST_SKIP() << "no oneDNN bf16 convolutions on this CPU";
  torch::NoGradGuard no_grad;
  auto net = bf16_net(12);
  std::map<std::string, torch::Tensor> original;
  for (const auto& p : net->named_parameters()) original[p.key()] = p.value().clone();
  const auto x = input({2, 64, 8, 8}, 13);
  const auto expected = plain_output(net, x);
  nn::set_weight_packing(*net, true);
  EXPECT_TRUE(torch::equal(net->forward(x), expected));
  for (const nn::Conv2d* conv : {&net->conv_in, &net->down, &net->shortcut}) {
    EXPECT_TRUE((*conv)->plain_weight_released());
    EXPECT_LE((*conv)->weight.storage().nbytes(), 2u) << "the plain storage is freed";
    EXPECT_EQ((*conv)->weight.sizes(), original
                                           .at(conv == &net->conv_in ? "conv_in.weight"
                                               : conv == &net->down  ? "down.weight"
                                                                     : "shortcut.weight")
                                           .sizes());
  }
  // 32x32 runs channels-last on the plain weight: it comes back, exactly.
  const auto large = input({1, 64, 32, 32}, 14).contiguous(torch::MemoryFormat::ChannelsLast);
  const auto large_out = net->forward(large);
  EXPECT_FALSE(net->conv_in->plain_weight_released());
  EXPECT_TRUE(torch::equal(net->conv_in->weight, original.at("conv_in.weight")));
  nn::set_weight_packing(*net, false);
  EXPECT_TRUE(torch::equal(net->forward(large), large_out));
  // Readers outside forward: drop_packed_weights gives every exact value back.
  nn::set_weight_packing(*net, true);
  net->forward(x);
  nn::drop_packed_weights(*net);
  for (const auto& p : net->named_parameters())
    EXPECT_TRUE(torch::equal(p.value(), original.at(p.key()))) << p.key();
  EXPECT_TRUE(torch::equal(net->forward(x), expected));
}

TEST(ConvPacking, NoCopyWhereItDoesNotApply) {
  DIFFUSE_SKIP_WITHOUT_CPU_BF16();
  auto net = bf16_net(9);
  nn::set_weight_packing(*net, true);
  {
    torch::NoGradGuard no_grad;
    // 32x32 and up run channels-last, where oneDNN reads the plain weight well enough.
    net->forward(input({1, 64, 32, 32}, 10).contiguous(torch::MemoryFormat::ChannelsLast));
    EXPECT_EQ(net->conv_in->packed_bytes(), 0);
    // float32 keeps LibTorch's path.
    Net f32;
    f32->eval();
    nn::set_weight_packing(*f32, true);
    f32->forward(torch::randn({1, 64, 8, 8}));
    EXPECT_EQ(nn::packed_weight_bytes(*f32), 0);
  }
  // Training: gradients must reach the plain weight.
  auto x = input({1, 64, 8, 8}, 11);
  net->conv_in->forward(x).to(torch::kFloat32).sum().backward();
  EXPECT_EQ(net->conv_in->packed_bytes(), 0);
  ASSERT_TRUE(net->conv_in->weight.grad().defined());
  EXPECT_GT(net->conv_in->weight.grad().abs().sum().item<double>(), 0.0);
}

}  // namespace test_conv_packing
