// LoRA adapter files: a safetensors file (the first input byte picks lenient mode) read and
// resolved against a small network with diffusers names (linear, list-indexed linear, 3x3 and
// 1x1 convs) by adapters::load_lora: key grouping in both namings, rank and shape checks,
// finite values. Only diffuse's own errors may come out.
#include <torch/torch.h>

#include <cstdint>
#include <string>

#include "adapters/lora.h"
#include "diffuse/errors.h"
#include "fuzz_util.h"

namespace {

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

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  static Toy toy;
  diffuse::adapters::LoraOptions options;
  options.lenient = (data[0] & 1) != 0;
  const auto path = diffuse::fuzz::write_scratch(
      "adapter.safetensors", std::string(reinterpret_cast<const char*>(data + 1), size - 1));
  try {
    auto adapter =
        diffuse::adapters::load_lora(path, {{diffuse::io::lora::unet_names(), toy.get()}}, options);
    for (const auto& p : adapter.pairs) p.up.matmul(p.down).sum();
  } catch (const diffuse::Error&) {
  }
  return 0;
}
