#include "train/demo_configs.h"

namespace diffuse::train {

using nlohmann::ordered_json;

// 8x downsampling: 128x128 images become 4x16x16 latents. Few channels at full resolution,
// where the convolutions cost most; flat colours and straight edges need little capacity.
ordered_json demo_vae_config(int resolution) {
  return {
      {"_class_name", "AutoencoderKL"},
      {"act_fn", "silu"},
      {"block_out_channels", {16, 32, 64, 64}},
      {"down_block_types",
       {"DownEncoderBlock2D", "DownEncoderBlock2D", "DownEncoderBlock2D", "DownEncoderBlock2D"}},
      {"in_channels", 3},
      {"latent_channels", 4},
      {"layers_per_block", 1},
      {"norm_num_groups", 8},
      {"out_channels", 3},
      {"sample_size", resolution},
      {"scaling_factor", 1.0},
      {"up_block_types",
       {"UpDecoderBlock2D", "UpDecoderBlock2D", "UpDecoderBlock2D", "UpDecoderBlock2D"}}};
}

ordered_json demo_unet_config(int latent_size) {
  return {{"_class_name", "UNet2DConditionModel"},
          {"act_fn", "silu"},
          {"attention_head_dim", {2, 4, 6}},
          {"block_out_channels", {32, 64, 96}},
          {"center_input_sample", false},
          {"cross_attention_dim", 64},
          {"down_block_types", {"DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"}},
          {"downsample_padding", 1},
          {"flip_sin_to_cos", true},
          {"freq_shift", 0},
          {"in_channels", 4},
          {"layers_per_block", 1},
          {"mid_block_scale_factor", 1},
          {"norm_eps", 1e-5},
          {"norm_num_groups", 16},
          {"out_channels", 4},
          {"sample_size", latent_size},
          {"up_block_types", {"CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"}},
          {"upcast_attention", false},
          {"use_linear_projection", true}};
}

ordered_json demo_text_encoder_config(int64_t vocab_size, int64_t bos, int64_t eos) {
  return {{"architectures", {"CLIPTextModel"}},
          {"model_type", "clip_text_model"},
          {"hidden_act", "gelu"},
          {"hidden_size", 64},
          {"intermediate_size", 256},
          {"num_attention_heads", 4},
          {"num_hidden_layers", 2},
          {"layer_norm_eps", 1e-5},
          {"max_position_embeddings", kDemoMaxTokens},
          {"vocab_size", vocab_size},
          {"bos_token_id", bos},
          {"eos_token_id", eos},
          {"pad_token_id", eos},
          {"projection_dim", 64},
          {"torch_dtype", "float32"}};
}

// DPM-Solver++ 2M: clean images in 20 steps with this model (so do DDIM and Euler). PNDM,
// diffusers' SD default, drifts in colour with it at 20 steps (PLMS extrapolation amplifies
// a small model's errors), so it is not the default here.
ordered_json demo_scheduler_config() {
  return {{"_class_name", "DPMSolverMultistepScheduler"},
          {"algorithm_type", "dpmsolver++"},
          {"beta_end", 0.012},
          {"beta_schedule", "scaled_linear"},
          {"beta_start", 0.00085},
          {"lower_order_final", true},
          {"num_train_timesteps", 1000},
          {"prediction_type", "epsilon"},
          {"solver_order", 2},
          {"solver_type", "midpoint"},
          {"steps_offset", 1},
          {"timestep_spacing", "leading"},
          {"trained_betas", nullptr}};
}

}  // namespace diffuse::train
