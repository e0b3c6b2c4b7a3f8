// The flags that say how a model is loaded (device, precision, attention, LoRA, offload...),
// shared by every command that loads a Stable Diffusion model (txt2img, img2img, serve).
#pragma once
#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "diffuse/pipeline.h"

namespace diffuse::app {

struct LoadFlags {
  std::string device = "auto", dtype = "auto", vae_dtype = "auto", attention = "auto";
  std::string text_encoder_device, vae_device;
  std::string config_dir;
  bool v_prediction = false, epsilon = false;
  bool offload = false;
  bool widen_weights = false;
  bool no_pack_weights = false;
  std::vector<std::string> loras;
  bool lora_lenient = false;
  std::string lora_mode = "merged";
  std::string weights = "none";
  std::string max_memory;  // the memory plan's budget ("24G"); empty: what the device has free
  std::string unet_file;
};

void add_load_flags(CLI::App& app, LoadFlags& f);
// Checks what can be checked before the (slow) load: device, dtypes, attention, LoRA syntax.
LoadOptions to_load_options(const LoadFlags& f);
// "PATH[:SCALE]": the scale is what follows the last ':' when it is a number.
LoraSpec parse_lora_flag(const std::string& value);

}  // namespace diffuse::app
