// Unmerged LoRA (adapters::LoraRuntime): the same adapter gives the same outputs as the merged
// one within float tolerance, for linear, 3x3 conv (stride, padding) and 1x1 conv layers; the
// weights are never written; rescale / remove / disable / clear give exactly the plain outputs
// back; full tensors and layers without a run-time path (grouped convolutions) are merged.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "adapters/lora.h"
#include "adapters/lora_merger.h"
#include "adapters/lora_runtime.h"
#include "io/lora_key_map.h"
#include "nn/layers.h"

namespace diffuse {
namespace test_lora_runtime {

using TensorMap = std::map<std::string, torch::Tensor>;

struct NetImpl : torch::nn::Module {
  NetImpl() {
    to_q = register_module("to_q", nn::make_linear(6, 5));
    conv_in = register_module(
        "conv_in", nn::make_conv2d(torch::nn::Conv2dOptions(4, 3, 3).stride(2).padding(1)));
    proj_in = register_module("proj_in", nn::make_conv2d(torch::nn::Conv2dOptions(4, 3, 1)));
    grouped =
        register_module("grouped", nn::make_conv2d(torch::nn::Conv2dOptions(4, 4, 1).groups(2)));
  }
  // Every layer's output, concatenated.
  torch::Tensor forward(const torch::Tensor& tokens, const torch::Tensor& image) {
    return torch::cat({to_q(tokens).flatten(), conv_in(image).flatten(), proj_in(image).flatten(),
                       grouped(image).flatten()});
  }
  nn::Linear to_q{nullptr};
  nn::Conv2d conv_in{nullptr}, proj_in{nullptr}, grouped{nullptr};
};
TORCH_MODULE(Net);

struct LoraRuntimeTest : ::testing::Test {
  LoraRuntimeTest() {
    torch::manual_seed(3);
    for (auto& p : net->parameters()) p.data().normal_();
    tokens = torch::randn({2, 7, 6});
    image = torch::randn({1, 4, 9, 9});
  }
  std::vector<adapters::Network> nets() { return {{io::lora::unet_names(), net.get()}}; }
  adapters::LoraAdapter adapter(bool with_full = false) {
    TensorMap t = {{"lora_unet_to_q.lora_down.weight", torch::randn({2, 6})},
                   {"lora_unet_to_q.lora_up.weight", torch::randn({5, 2})},
                   {"lora_unet_to_q.alpha", torch::tensor(4.0)},
                   {"lora_unet_conv_in.lora_down.weight", torch::randn({2, 4, 3, 3})},
                   {"lora_unet_conv_in.lora_up.weight", torch::randn({3, 2, 1, 1})},
                   {"lora_unet_proj_in.lora_down.weight", torch::randn({2, 4, 1, 1})},
                   {"lora_unet_proj_in.lora_up.weight", torch::randn({3, 2, 1, 1})},
                   {"lora_unet_grouped.lora_down.weight", torch::randn({2, 2, 1, 1})},
                   {"lora_unet_grouped.lora_up.weight", torch::randn({4, 2, 1, 1})}};
    if (with_full) t["unet.proj_in.bias"] = torch::randn({3});
    return adapters::make_lora(t, {}, "test", nets());
  }
  torch::Tensor out() { return net->forward(tokens, image); }
  TensorMap weights() {
    TensorMap w;
    for (const auto& p : net->named_parameters()) w[p.key()] = p.value().detach().clone();
    return w;
  }

  Net net;
  torch::Tensor tokens, image;
};

TEST_F(LoraRuntimeTest, MatchesTheMergedAdapterWithoutWritingAttachedWeights) {
  const auto plain = out();
  const auto before = weights();
  const auto a = adapter();
  torch::Tensor merged_out;
  {
    adapters::LoraMerger merger(nets());
    merger.add(a, 0.7);
    merged_out = out();
    merger.clear();
  }
  ASSERT_TRUE(torch::equal(out(), plain));

  adapters::LoraRuntime runtime(nets());
  const int id = runtime.add(a, 0.7);
  EXPECT_EQ(runtime.attached_pairs(), 3u);  // to_q, conv_in, proj_in
  EXPECT_EQ(runtime.merged_weights(), 1u);  // the grouped convolution has no run-time path
  EXPECT_TRUE(torch::allclose(out(), merged_out, 1e-4, 1e-5));
  EXPECT_GT((out() - plain).abs().max().item<float>(), 1e-2);
  for (const char* name : {"to_q.weight", "conv_in.weight", "proj_in.weight"})
    EXPECT_TRUE(torch::equal(net->named_parameters()[name], before.at(name))) << name;

  runtime.set_scale(id, 0.0);
  EXPECT_TRUE(torch::equal(out(), plain));
  runtime.set_scale(id, 0.7);
  runtime.set_lora_enabled(false);
  EXPECT_TRUE(torch::equal(out(), plain));
  runtime.set_lora_enabled(true);
  EXPECT_TRUE(torch::allclose(out(), merged_out, 1e-4, 1e-5));
  runtime.remove(id);
  EXPECT_TRUE(torch::equal(out(), plain));
  for (const auto& [name, w] : before) EXPECT_TRUE(torch::equal(weights().at(name), w)) << name;
}

TEST_F(LoraRuntimeTest, FullTensorsAreMergedAndStayWhenAdaptersAreOff) {
  const auto plain = out();
  const auto before = weights();
  adapters::LoraRuntime runtime(nets());
  const auto a = adapter(/*with_full=*/true);
  runtime.add(a, 1.0);
  runtime.set_lora_enabled(false);
  EXPECT_TRUE(torch::equal(net->named_parameters()["proj_in.bias"], a.full.at(0).value));
  EXPECT_FALSE(torch::equal(out(), plain));
  runtime.clear();
  EXPECT_TRUE(torch::equal(out(), plain));
  for (const auto& [name, w] : before) EXPECT_TRUE(torch::equal(weights().at(name), w)) << name;
}

TEST_F(LoraRuntimeTest, DestroyingTheRuntimeDetachesItsUpdates) {
  const auto plain = out();
  {
    adapters::LoraRuntime runtime(nets());
    runtime.add(adapter(), 1.0);
    EXPECT_FALSE(net->to_q->low_rank.empty());
  }
  EXPECT_TRUE(net->to_q->low_rank.empty());
  EXPECT_TRUE(net->conv_in->low_rank.empty());
  EXPECT_FALSE(torch::equal(out(), plain));  // the merged part (grouped conv) stays, as documented
}

}  // namespace test_lora_runtime
}  // namespace diffuse
