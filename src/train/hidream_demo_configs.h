// The configurations of the HiDream-architecture demo model (`diffuse train-demo --arch
// hidream-e1`): the real family's config files and keys (HiDreamImageTransformer2DModel, the
// Flux-style 16-channel AutoencoderKL, CLIP-L/G with projection, T5, Llama), at a size that
// trains on 2 CPU cores.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>

namespace diffuse::train {

// The VAE's downsampling: 16 rather than the real family's 8, so that a 128-pixel image is 4x4
// tokens of patch 2 and a training step costs a third (the demo world is flat colours; the
// pipelines read the factor from the VAE's config).
constexpr int kHiDreamDemoVaeFactor = 16;
// kHiDreamDemoVaeFactor downsampling to 16 latent channels, shift and scale set from the data
// after training.
nlohmann::ordered_json hidream_demo_vae_config(int resolution);
// D = 96 (3 heads of 32), patch 2, dual- and single-stream blocks with a 4-expert (top-2) MoE and
// the shared expert, one Llama layer per block; max_resolution in latent pixels (the text-to-image
// area).
nlohmann::ordered_json hidream_demo_transformer_config(int latent_size, int64_t t5_dim,
                                                       int64_t llama_dim, int64_t pooled_dim,
                                                       int64_t llama_layers);
nlohmann::ordered_json hidream_demo_clip_config(int64_t vocab_size, int64_t bos, int64_t eos,
                                                int64_t projection_dim);
nlohmann::ordered_json hidream_demo_t5_config(int64_t vocab_size);
nlohmann::ordered_json hidream_demo_llama_config(int64_t vocab_size, int64_t bos, int64_t eos,
                                                 int64_t layers);
// FlowMatchEulerDiscreteScheduler with a fixed shift (the trainer draws sigmas with the same).
nlohmann::ordered_json hidream_demo_scheduler_config(double shift);
// model_index.json: HiDream's pipeline layout and classes, plus "_diffuse_defaults" (steps,
// guidance, max_sequence_length the model is tuned for; diffusers ignores "_" keys).
nlohmann::ordered_json hidream_demo_model_index(const nlohmann::ordered_json& defaults);

}  // namespace diffuse::train
