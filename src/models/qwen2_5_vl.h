// Qwen2_5_VLForConditionalGeneration (transformers models/qwen2_5_vl) used as a text encoder,
// as Qwen-Image and Qwen-Image-Edit take Qwen2.5-VL-7B-Instruct: the vision tower (3D patch
// embedding, blocks of windowed and full attention with 2D rotary positions, the 2x2 patch
// merger) whose output replaces the <|image_pad|> embeddings, and the Qwen2 language model
// (Llama's decoder layers with q/k/v biases, grouped-query attention) under multimodal RoPE:
// three position axes (t, h, w), each owning mrope_section of the rotary frequencies. The
// language-model head is neither built nor loaded. Parameter names equal the transformers keys
// of the v4.51 layout ("model.layers.0...", "visual.blocks.0..."); the newer layout
// ("model.language_model.*", "model.visual.*") loads through a mapping.
#pragma once
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/types.h>

#include <array>
#include <string>
#include <vector>

#include "io/json_config.h"
#include "models/llama.h"
#include "nn/layers.h"

namespace diffuse::io {
class ModelFolder;
}

namespace diffuse::models {

struct Qwen2_5_VLVisionConfig {
  int64_t depth = 32;
  int64_t hidden_size = 1280;
  int64_t intermediate_size = 3420;
  int64_t num_heads = 16;
  int64_t in_channels = 3;
  int64_t patch_size = 14;
  int64_t temporal_patch_size = 2;
  int64_t spatial_merge_size = 2;
  int64_t window_size = 112;
  int64_t out_hidden_size = 3584;
  std::vector<int64_t> fullatt_block_indexes{7, 15, 23, 31};
  int64_t head_dim() const { return hidden_size / num_heads; }
};

struct Qwen2_5_VLConfig {
  std::string source;
  LlamaConfig text;  // the Qwen2 language model (attention_bias: q/k/v only)
  // Rotary frequencies per position axis (t, h, w); sums to text.head_dim / 2.
  std::array<int64_t, 3> mrope_section{16, 24, 24};
  bool has_vision = true;
  Qwen2_5_VLVisionConfig vision;
  int64_t image_token_id = 151655;
  int64_t vision_start_token_id = 151652;

  // The flat v4.51 layout (text keys at the top) or the nested one (text_config); ConfigError
  // naming the file and key for unsupported values.
  static Qwen2_5_VLConfig from_json(const io::JsonConfig& cfg);
};

// The vision tower ("visual.*").
struct Qwen2_5_VisionTransformerImpl : torch::nn::Module {
  explicit Qwen2_5_VisionTransformerImpl(const Qwen2_5_VLVisionConfig& c);
  // pixel_values [N, C * T * P * P] (the image processor's patches), grid (t, h, w) in patches
  // -> merged embeddings [N / merge^2, out_hidden_size].
  torch::Tensor forward(const torch::Tensor& pixel_values, const std::array<int64_t, 3>& grid);

  Qwen2_5_VLVisionConfig config;
  torch::Tensor patch_weight;  // patch_embed.proj.weight [hidden, C, T, P, P]
  std::vector<LlamaRMSNorm> norm1, norm2;
  std::vector<nn::Linear> qkv, proj;
  std::vector<LlamaMLP> mlp;
  LlamaRMSNorm ln_q{nullptr};
  nn::Linear merger_fc1{nullptr}, merger_fc2{nullptr};
};
TORCH_MODULE(Qwen2_5_VisionTransformer);

// What the text encoder returns to the pipelines.
struct Qwen2_5_VLOutput {
  torch::Tensor last_hidden_state;  // hidden_states[-1]: after the final norm, [B, L, hidden]
  torch::Tensor position_ids;       // [3, B, L] int64 (mRoPE positions)
  torch::Tensor rope_deltas;        // [B, 1] int64
  torch::Tensor image_embeds;       // [tokens, hidden] or undefined without an image
};

class Qwen2_5_VLForConditionalGenerationImpl : public torch::nn::Module {
 public:
  explicit Qwen2_5_VLForConditionalGenerationImpl(const Qwen2_5_VLConfig& config);

  // input_ids [B, L] int64; attention_mask [B, L] (1 = token) or undefined; pixel_values and
  // grid as the image processor makes them for the image whose <|image_pad|> tokens are in
  // input_ids (one image for every sequence of the batch), or undefined. InvalidArgument when
  // the number of image tokens does not match the image, an id is outside the vocabulary, or
  // an image is given to a model without a vision tower.
  Qwen2_5_VLOutput forward(const torch::Tensor& input_ids, const torch::Tensor& attention_mask,
                           const torch::Tensor& pixel_values = {},
                           const std::array<int64_t, 3>& grid = {});

  const Qwen2_5_VLConfig& config() const { return config_; }

  LlamaModel model{nullptr};
  Qwen2_5_VisionTransformer visual{nullptr};

 private:
  Qwen2_5_VLConfig config_;
};
TORCH_MODULE(Qwen2_5_VLForConditionalGeneration);

// get_rope_index: the 3D positions of a sequence and its rope delta. Text tokens count up on
// all three axes; the merged grid of an image (after <|vision_start|>) takes (0, row, col)
// offset by the position after the preceding text.
std::pair<torch::Tensor, torch::Tensor> qwen2_5_vl_rope_index(const torch::Tensor& input_ids,
                                                              const torch::Tensor& attention_mask,
                                                              const Qwen2_5_VLConfig& config,
                                                              const std::array<int64_t, 3>& grid);

// Whether the component has a vision tower: a vision_config in config.json and visual.* (or
// model.visual.*) weights; read from the names only, nothing loads.
bool qwen2_5_vl_has_vision(const io::ModelFolder& folder, const std::string& component);

// Builds from <folder>/<component> on `device` in `dtype`. Without a vision tower in the
// weights (a text-only Qwen2.5 checkpoint) only t2i prompts can be encoded.
Qwen2_5_VLForConditionalGeneration load_qwen2_5_vl(const io::ModelFolder& folder,
                                                   const std::string& component,
                                                   torch::Device device, torch::Dtype dtype);

}  // namespace diffuse::models
