// `diffuse quantize`: writes a model's weights (or one component's) as a GGUF file.
#include <cstdio>

#include "commands.h"
#include "quant/quantize_model.h"

namespace diffuse::app {

Command add_quantize_command(CLI::App& app) {
  auto o = std::make_shared<quant::QuantizeOptions>();
  app.add_option("-m,--model", o->model, "A diffusers folder or a single weights file")->required();
  app.add_option("--component", o->component,
                 "Folder only: the component to write (default: transformer, else unet)");
  app.add_option("--type", o->type, "q8_0, q4_0, f16, bf16 or f32")->capture_default_str();
  app.add_option("-o,--out", o->out, "The .gguf file to write")->required();
  return [o]() {
    const auto r = quant::quantize_model(*o);
    const double gb = 1e9;
    std::printf("wrote %s: %d of %d tensors in %s, %.3f GB -> %.3f GB (%.0f %%)\n", o->out.c_str(),
                r.quantized, r.tensors, o->type.c_str(), r.bytes_in / gb, r.bytes_out / gb,
                r.bytes_in ? 100.0 * r.bytes_out / r.bytes_in : 0.0);
    return 0;
  };
}

}  // namespace diffuse::app
