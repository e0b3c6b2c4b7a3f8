// LoRA adapter files: a safetensors file (the first input byte picks lenient mode) read and
// resolved against a small network with diffusers names (linear, list-indexed linear, 3x3 and
// 1x1 convs) by adapters::load_lora: key grouping in both namings, rank and shape checks,
// finite values. Only diffuse's own errors may come out.
#include <torch/torch.h>

#include <cstdint>
#include <string>

#include "../lora_toy_network.h"
#include "adapters/lora.h"
#include "diffuse/errors.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  static diffuse::test::Toy toy;
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
