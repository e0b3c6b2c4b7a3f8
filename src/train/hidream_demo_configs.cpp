#include "train/hidream_demo_configs.h"

namespace diffuse::train {

using nlohmann::ordered_json;

ordered_json hidream_demo_vae_config(int resolution) {
  // One level per halving, plus the first.
  ordered_json channels = {16, 32}, down = ordered_json::array(), up = ordered_json::array();
  for (int f = 4; f <= kHiDreamDemoVaeFactor; f *= 2) channels.push_back(64);
  for (size_t i = 0; i < channels.size(); ++i) {
    down.push_back("DownEncoderBlock2D");
    up.push_back("UpDecoderBlock2D");
  }
  return {{"_class_name", "AutoencoderKL"},
          {"act_fn", "silu"},
          {"block_out_channels", channels},
          {"down_block_types", down},
          {"force_upcast", true},
          {"in_channels", 3},
          {"latent_channels", 16},
          {"latents_mean", nullptr},
          {"latents_std", nullptr},
          {"layers_per_block", 1},
          {"mid_block_add_attention", true},
          {"norm_num_groups", 8},
          {"out_channels", 3},
          {"sample_size", resolution},
          {"scaling_factor", 1.0},
          {"shift_factor", 0.0},
          {"up_block_types", up},
          {"use_post_quant_conv", false},
          {"use_quant_conv", false}};
}

ordered_json hidream_demo_transformer_config(int latent_size, int64_t t5_dim, int64_t llama_dim,
                                             int64_t pooled_dim, int64_t llama_layers) {
  constexpr int kDual = 2, kSingle = 2;
  ordered_json layers = ordered_json::array();
  // Block i reads Llama layer i (the last ones repeated when there are fewer layers).
  for (int i = 0; i < kDual + kSingle; ++i)
    layers.push_back(std::min<int64_t>(i, llama_layers - 1));
  return {{"_class_name", "HiDreamImageTransformer2DModel"},
          {"patch_size", 2},
          {"in_channels", 16},
          {"out_channels", 16},
          {"num_layers", kDual},
          {"num_single_layers", kSingle},
          {"attention_head_dim", 32},
          {"num_attention_heads", 3},
          {"caption_channels", {t5_dim, llama_dim}},
          {"text_emb_dim", pooled_dim},
          {"num_routed_experts", 4},
          {"num_activated_experts", 2},
          {"axes_dims_rope", {8, 12, 12}},
          {"max_resolution", {latent_size, latent_size}},
          {"llama_layers", layers},
          {"force_inference_output", false}};
}

ordered_json hidream_demo_clip_config(int64_t vocab_size, int64_t bos, int64_t eos,
                                      int64_t projection_dim) {
  return {{"architectures", {"CLIPTextModelWithProjection"}},
          {"model_type", "clip_text_model"},
          {"hidden_act", "gelu"},
          {"hidden_size", 64},
          {"intermediate_size", 128},
          {"num_attention_heads", 4},
          {"num_hidden_layers", 2},
          {"layer_norm_eps", 1e-5},
          // HiDream runs CLIP on Long-CLIP-length ids.
          {"max_position_embeddings", 248},
          {"vocab_size", vocab_size},
          {"bos_token_id", bos},
          {"eos_token_id", eos},
          {"pad_token_id", eos},
          {"projection_dim", projection_dim},
          {"torch_dtype", "float32"}};
}

ordered_json hidream_demo_t5_config(int64_t vocab_size) {
  return {{"architectures", {"T5EncoderModel"}},
          {"model_type", "t5"},
          {"d_model", 64},
          {"d_kv", 16},
          {"d_ff", 128},
          {"num_layers", 2},
          {"num_heads", 4},
          {"dense_act_fn", "gelu_new"},
          {"feed_forward_proj", "gated-gelu"},
          {"is_gated_act", true},
          {"layer_norm_epsilon", 1e-6},
          {"relative_attention_num_buckets", 32},
          {"relative_attention_max_distance", 128},
          {"dropout_rate", 0.0},
          {"eos_token_id", 1},
          {"pad_token_id", 0},
          {"decoder_start_token_id", 0},
          {"is_encoder_decoder", true},
          {"tie_word_embeddings", false},
          {"vocab_size", vocab_size},
          {"torch_dtype", "float32"}};
}

ordered_json hidream_demo_llama_config(int64_t vocab_size, int64_t bos, int64_t eos,
                                       int64_t layers) {
  return {{"architectures", {"LlamaForCausalLM"}},
          {"model_type", "llama"},
          {"attention_bias", false},
          {"attention_dropout", 0.0},
          {"bos_token_id", bos},
          {"eos_token_id", eos},
          {"hidden_act", "silu"},
          {"hidden_size", 64},
          {"intermediate_size", 128},
          {"max_position_embeddings", 2048},
          {"mlp_bias", false},
          {"num_attention_heads", 4},
          {"num_hidden_layers", layers},
          {"num_key_value_heads", 2},
          {"rms_norm_eps", 1e-5},
          {"rope_scaling", nullptr},
          {"rope_theta", 10000.0},
          {"tie_word_embeddings", true},
          {"vocab_size", vocab_size},
          {"torch_dtype", "float32"}};
}

ordered_json hidream_demo_scheduler_config(double shift) {
  return {{"_class_name", "FlowMatchEulerDiscreteScheduler"},
          {"base_image_seq_len", 256},
          {"base_shift", 0.5},
          {"invert_sigmas", false},
          {"max_image_seq_len", 4096},
          {"max_shift", 1.15},
          {"num_train_timesteps", 1000},
          {"shift", shift},
          {"shift_terminal", nullptr},
          {"stochastic_sampling", false},
          {"time_shift_type", "exponential"},
          {"use_beta_sigmas", false},
          {"use_dynamic_shifting", false},
          {"use_exponential_sigmas", false},
          {"use_karras_sigmas", false}};
}

ordered_json hidream_demo_model_index(const ordered_json& defaults) {
  return {{"_class_name", "HiDreamImageEditingPipeline"},
          {"_diffusers_version", "0.34.0"},
          {"_diffuse_note",
           "trained from scratch by `diffuse train-demo --arch hidream-e1` on the demo world (see "
           "training.json)"},
          {"_diffuse_defaults", defaults},
          {"scheduler", {"diffusers", "FlowMatchEulerDiscreteScheduler"}},
          {"text_encoder", {"transformers", "CLIPTextModelWithProjection"}},
          {"text_encoder_2", {"transformers", "CLIPTextModelWithProjection"}},
          {"text_encoder_3", {"transformers", "T5EncoderModel"}},
          {"text_encoder_4", {"transformers", "LlamaForCausalLM"}},
          {"tokenizer", {"transformers", "CLIPTokenizer"}},
          {"tokenizer_2", {"transformers", "CLIPTokenizer"}},
          {"tokenizer_3", {"transformers", "T5Tokenizer"}},
          {"tokenizer_4", {"transformers", "PreTrainedTokenizerFast"}},
          {"transformer", {"diffusers", "HiDreamImageTransformer2DModel"}},
          {"vae", {"diffusers", "AutoencoderKL"}}};
}

}  // namespace diffuse::train
