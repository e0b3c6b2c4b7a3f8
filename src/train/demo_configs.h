// The demo model's architecture: small Stable-Diffusion-shaped networks sized so that
// `diffuse train-demo` trains them on 2 CPU cores in about an hour and the F16 folder stays
// under 10 MB. Written as the diffusers config.json files the folder ships.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>

namespace diffuse::train {

// Tokens per caption, BOS/EOS included (the longest caption of the world has 21).
constexpr int kDemoMaxTokens = 32;

nlohmann::ordered_json demo_vae_config(int resolution);
nlohmann::ordered_json demo_unet_config(int latent_size);
nlohmann::ordered_json demo_text_encoder_config(int64_t vocab_size, int64_t bos, int64_t eos);
nlohmann::ordered_json demo_scheduler_config();

}  // namespace diffuse::train
