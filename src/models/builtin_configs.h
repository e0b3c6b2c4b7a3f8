// Built-in model architectures: the real diffusers config.json files of Stable Diffusion
// 2.1-base, 2.1 (768-v), 1.5 and XL base 1.0, a tiny one for smoke tests, and HiDream-I1's
// transformer. The benchmarks and create-demo-model build models from these with random weights, so
// they run at real sizes without downloads.
#pragma once
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace diffuse::models {

struct ArchConfigs {
  std::string name;
  std::string description;
  nlohmann::json unet, vae, text_encoder, scheduler;
  // SDXL's second text encoder (CLIP-G, CLIPTextModelWithProjection); null for SD 1.x/2.x.
  nlohmann::json text_encoder_2;
};

// "sd2.1-base", "sd2.1", "sd1.5", "sdxl", "tiny"; InvalidArgument listing the names otherwise.
const ArchConfigs& builtin_arch(const std::string& name);
std::vector<std::string> builtin_arch_names();

// HiDream-I1's transformer/config.json (17B: 16 dual-stream and 32 single-stream blocks).
nlohmann::json hidream_i1_transformer_config();
bool is_hidream_arch(const std::string& name);  // "hidream-i1"

// FLUX.1-dev's transformer/config.json (12B: 19 double- and 38 single-stream blocks); schnell's
// is the same without the guidance embedding.
nlohmann::json flux_transformer_config(bool guidance_embeds);
bool is_flux_arch(const std::string& name);  // "flux-dev", "flux-schnell"
// Qwen-Image's 20B MMDiT (Qwen-Image-Edit has the same).
nlohmann::json qwenimage_transformer_config();
bool is_qwenimage_arch(const std::string& name);  // "qwen-image"
// T5-XXL v1.1's encoder (FLUX's text_encoder_2, HiDream's text_encoder_3; 4.8B parameters) and
// Llama-3.1-8B-Instruct (HiDream's text_encoder_4), as their config.json files say.
nlohmann::json t5_xxl_encoder_config();
nlohmann::json llama31_8b_config();
// CLIP ViT-L/14's text tower (SD 1.x, FLUX's text_encoder) and OpenCLIP bigG's with its
// projection (SDXL's text_encoder_2).
nlohmann::json clip_l_text_config();
nlohmann::json clip_g_text_config();
// The 16-channel AutoencoderKL of FLUX.1 (HiDream ships the same).
nlohmann::json flux_vae_config();
// The DiTs the block benchmark builds one block of each kind of: HiDream and FLUX.
bool is_dit_arch(const std::string& name);

}  // namespace diffuse::models
