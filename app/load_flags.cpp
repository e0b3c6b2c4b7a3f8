#include "load_flags.h"

#include <cmath>
#include <filesystem>

#include "device/device.h"
#include "flag_checks.h"
#include "memory_flags.h"
#include "nn/attention.h"
#include "quant/quantized_weight.h"
#include "text/lora_tags.h"

namespace diffuse::app {

LoraSpec parse_lora_flag(const std::string& value) {
  LoraSpec spec{value, 1.0};
  const size_t colon = value.rfind(':');
  if (colon != std::string::npos && colon > 0) {
    const std::string tail = value.substr(colon + 1);
    try {
      size_t used = 0;
      double scale = std::stod(tail, &used);
      if (used == tail.size()) spec = {value.substr(0, colon), scale};
    } catch (const std::exception&) {
      // Not a number: part of the path, unless only the part before it names a file.
    }
    std::error_code ec;
    if (spec.path == value && !std::filesystem::exists(value, ec) &&
        std::filesystem::exists(value.substr(0, colon), ec))
      throw InvalidArgument("--lora '" + value + "': the scale '" + tail +
                            "' after the last ':' is not a number (PATH[:SCALE])");
  }
  if (!(std::fabs(spec.scale) <= text::kMaxLoraScale))
    throw InvalidArgument("--lora '" + value + "': the scale must be a number in [-100, 100]");
  return spec;
}

void add_load_flags(CLI::App& app, LoadFlags& f) {
  app.add_option("--device", f.device, "auto|cpu|cuda[:N]|npu[:N] (env DIFFUSE_DEVICE)")
      ->capture_default_str()
      ->check(non_empty());
  app.add_option("--text-encoder-device", f.text_encoder_device,
                 "Device for the text encoder (default: --device)")
      ->check(non_empty());
  app.add_option("--vae-device", f.vae_device, "Device for the VAE (default: --device)")
      ->check(non_empty());
  app.add_option("--dtype", f.dtype, "auto|fp32|bf16|fp16 for text encoder and UNet")
      ->capture_default_str()
      ->check(non_empty());
  app.add_option("--vae-dtype", f.vae_dtype, "auto|fp32|bf16|fp16 for the VAE")
      ->capture_default_str()
      ->check(non_empty());
  app.add_option("--attention", f.attention,
                 "auto|math|sdpa|flash|npu (env DIFFUSE_ATTENTION); math is the reference path "
                 "(also no fused npu operators and no float32 GEGLU kernel)")
      ->capture_default_str()
      ->check(non_empty());
  app.add_flag(
      "--offload", f.offload,
      "Keep each network in memory only while it runs (lowest peak memory, ~1 s more per image)");
  app.add_flag("--widen-weights", f.widen_weights,
               "float32 on the CPU: widen a 16-bit model's weights at load (default: keep them "
               "16-bit and widen per call; the same image, about half the weight memory)");
  app.add_flag("--no-pack-weights", f.no_pack_weights,
               "bf16 on the CPU: let oneDNN reorder the UNet's low-resolution convolution "
               "weights at every call (default: keep a packed copy; ~4 % faster steps, ~0.9 GiB "
               "more for SD2.1)");
  app.add_option("--weights", f.weights,
                 "Keep the denoiser's linear weights (and Stable Diffusion's UNet and VAE "
                 "convolutions) quantized in memory: none, q8_0 (~53 % of bf16's bytes), q4_0 "
                 "(~28 %), dequantized per layer as it runs; int8 (~50 %, one scale per row), "
                 "multiplied in 8-bit integers on CPUs with AVX512-VNNI and no AMX (LoRAs "
                 "unmerged)")
      ->capture_default_str()
      ->check(non_empty());
  add_max_memory_flag(app, f.max_memory);
  app.add_option("--unet", f.unet_file,
                 "A UNet file replacing the model's (safetensors or GGUF, e.g. city96's; "
                 "diffusers or original LDM names); a GGUF's quantized matrices stay quantized")
      ->check(CLI::ExistingFile);
  app.add_option("--lora", f.loras,
                 "LoRA adapter PATH[:SCALE] (default scale 1; repeat for several) merged into "
                 "the UNet and text encoder");
  app.add_flag("--lora-lenient", f.lora_lenient,
               "Warn about LoRA tensors that match no weight instead of failing");
  app.add_option("--lora-mode", f.lora_mode,
                 "merged: adapters written into the weights (no cost per step); unmerged: added "
                 "at run time (switching is free, each step pays the low-rank products)")
      ->capture_default_str()
      ->check(CLI::IsMember({"merged", "unmerged"}));
  app.add_option("--config", f.config_dir,
                 "Diffusers folder giving configs/tokenizer for a single-file checkpoint")
      ->check(non_empty());
  app.add_flag("--v-prediction", f.v_prediction,
               "Single-file checkpoint is v-prediction (SD2.x 768-v)");
  app.add_flag("--epsilon", f.epsilon, "Single-file checkpoint is epsilon-prediction");
}

LoadOptions to_load_options(const LoadFlags& f) {
  if (f.v_prediction && f.epsilon)
    throw InvalidArgument("--v-prediction and --epsilon are mutually exclusive");
  auto dev = device::resolve_device(f.device);
  device::resolve_dtype(f.dtype, dev, "unet");
  device::resolve_dtype(f.vae_dtype, dev, "vae");
  nn::parse_attention_backend(f.attention);
  LoadOptions lo;
  lo.device = f.device;
  lo.text_encoder_device = f.text_encoder_device;
  lo.vae_device = f.vae_device;
  lo.dtype = f.dtype;
  lo.vae_dtype = f.vae_dtype;
  lo.attention = f.attention;
  lo.config_dir = f.config_dir;
  if (f.v_prediction) lo.v_prediction = true;
  if (f.epsilon) lo.v_prediction = false;
  lo.offload = f.offload;
  lo.keep_16bit_weights = !f.widen_weights;
  lo.pack_conv_weights = !f.no_pack_weights;
  for (const auto& l : f.loras) lo.loras.push_back(parse_lora_flag(l));
  lo.lora_lenient = f.lora_lenient;
  lo.lora_mode = f.lora_mode;
  quant::parse_weight_type(f.weights, "--weights");
  lo.weights = f.weights;
  lo.max_memory = max_memory_bytes(f.max_memory);
  lo.unet_file = f.unet_file;
  return lo;
}

}  // namespace diffuse::app
