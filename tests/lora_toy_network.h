// A small network with diffusers-like parameter names (a linear, a list-indexed linear, a 3x3
// and a 1x1 convolution) for LoRA tests and the LoRA fuzz harness: adapters address it as a
// UNet (io::lora::unet_names()).
#pragma once
#include <torch/torch.h>

namespace diffuse::test {

struct AttnImpl : torch::nn::Module {
  AttnImpl() {
    to_q = register_module("to_q", torch::nn::Linear(6, 5));
    to_out = register_module("to_out", torch::nn::ModuleList());
    to_out->push_back(torch::nn::Linear(5, 6));
  }
  torch::nn::Linear to_q{nullptr};
  torch::nn::ModuleList to_out{nullptr};
};
TORCH_MODULE(Attn);

struct ToyImpl : torch::nn::Module {
  ToyImpl() {
    attn1 = register_module("attn1", Attn());
    conv_in = register_module("conv_in", torch::nn::Conv2d(torch::nn::Conv2dOptions(4, 3, 3)));
    proj_in = register_module("proj_in", torch::nn::Conv2d(torch::nn::Conv2dOptions(4, 3, 1)));
  }
  Attn attn1{nullptr};
  torch::nn::Conv2d conv_in{nullptr}, proj_in{nullptr};
};
TORCH_MODULE(Toy);

}  // namespace diffuse::test
