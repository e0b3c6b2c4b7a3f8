// FluxTransformer2DModel (diffusers transformers/transformer_flux.py): the MM-DiT of FLUX.1
// dev/schnell and FLUX.1 Kontext, built from its config.json with diffusers' module names so
// that transformer/diffusion_pytorch_model*.safetensors load by name.
//
// It works on PACKED latents: tokens [B, S, in_channels] (2x2 latent patches, see flux_pack),
// with one position id (frame, row, col) per image token and per text token; the joint
// sequence is [text | image] and the rotary table follows cat(txt_ids, img_ids).
#pragma once
#include <torch/nn/module.h>
#include <torch/types.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "io/json_config.h"
#include "io/model_folder.h"
#include "models/block_streaming.h"
#include "models/intermediates.h"
#include "nn/embeddings.h"
#include "nn/flux_blocks.h"
#include "nn/layers.h"

namespace diffuse::accel {
class DitCache;
}

namespace diffuse::parallel {
class RankGroup;
}

namespace diffuse::models {

// FluxPosEmbed's theta (diffusers hard-codes it; configs do not carry it).
constexpr double kFluxRopeTheta = 10000.0;

struct FluxTransformerConfig {
  std::string source;  // the config file, for messages
  int64_t patch_size = 1;
  int64_t in_channels = 64;
  int64_t out_channels = 64;       // config null -> in_channels
  int64_t num_layers = 19;         // double-stream blocks
  int64_t num_single_layers = 38;  // single-stream blocks
  int64_t attention_head_dim = 128;
  int64_t num_attention_heads = 24;
  int64_t joint_attention_dim = 4096;   // T5's d_model
  int64_t pooled_projection_dim = 768;  // CLIP-L's pooled width
  bool guidance_embeds = false;         // FLUX.1-dev: true (guidance distillation)
  std::vector<int64_t> axes_dims_rope{16, 56, 56};

  // Parses and validates; ConfigError naming the file, key and value on any problem.
  static FluxTransformerConfig from_json(const io::JsonConfig& cfg);
  int64_t inner_dim() const { return num_attention_heads * attention_head_dim; }
  nn::FluxBlockOptions block_options() const;
};

struct FluxForwardOptions {
  // A DiT cache (accel/dit_cache.h) this call consults and updates. Null: every block runs.
  accel::DitCache* cache = nullptr;
  // Ulysses sequence parallelism (parallel/ulysses.h): every rank of the group makes this call
  // with the same inputs; each runs its share of the image tokens and all get the whole
  // output. Null: one device. Not with `intermediates`.
  parallel::RankGroup* sequence_group = nullptr;
};

class FluxTransformer2DModelImpl : public torch::nn::Module {
 public:
  explicit FluxTransformer2DModelImpl(FluxTransformerConfig config);

  // hidden_states [B, S, in_channels] (packed tokens); timestep [B] or one value, t/1000 (the
  // model multiplies by 1000, as diffusers does); encoder_hidden_states [B, L,
  // joint_attention_dim] (T5); pooled [B, pooled_projection_dim] (CLIP); img_ids [S, 3] and
  // txt_ids [L, 3] (or [1, N, 3]); guidance [B] or one value, required exactly when the config
  // has guidance_embeds. Returns the RAW output [B, S, patch^2 * out_channels] (the velocity;
  // FLUX pipelines use it as is). InvalidArgument naming the input and the expected shape.
  // With `intermediates`: x_embedder, time_text_embed, context_embedder, pos_embed.{cos,sin},
  // transformer_blocks.i.{text,image}, single_transformer_blocks.i.{text,image}, norm_out.
  torch::Tensor forward(const torch::Tensor& hidden_states, const torch::Tensor& timestep,
                        const torch::Tensor& encoder_hidden_states, const torch::Tensor& pooled,
                        const torch::Tensor& img_ids, const torch::Tensor& txt_ids,
                        const torch::Tensor& guidance = {}, const FluxForwardOptions& options = {},
                        Intermediates* intermediates = nullptr);

  const FluxTransformerConfig& config() const { return config_; }

  std::vector<nn::FluxTransformerBlock> double_blocks;
  std::vector<nn::FluxSingleTransformerBlock> single_blocks;
  // Set by load_flux_transformer(..., stream = true): the blocks' weights come in from the
  // mapped files as the blocks run (double block i is stream block i, single block j is
  // num_layers + j).
  std::shared_ptr<BlockWeightStream> stream;

  // The embedders and the output head (read by the ONNX export, src/export).
  nn::Timesteps time_proj{nullptr};
  nn::TimestepEmbedding timestep_embedder{nullptr}, guidance_embedder{nullptr},
      text_embedder{nullptr};
  nn::Linear context_embedder{nullptr}, x_embedder{nullptr};
  nn::Linear norm_out_linear{nullptr}, proj_out{nullptr};

 private:
  void check_inputs(const torch::Tensor& x, const torch::Tensor& timestep, const torch::Tensor& enc,
                    const torch::Tensor& pooled, const torch::Tensor& img_ids,
                    const torch::Tensor& txt_ids, const torch::Tensor& guidance) const;

  FluxTransformerConfig config_;
};
TORCH_MODULE(FluxTransformer2DModel);

// Loads `<component>/` (config.json + weights) of a diffusers folder onto `device` in `dtype`;
// the weights in diffusers' names or in BFL's original ones (models/flux_bfl_names.h).
// ConfigError/FormatError naming the file on a bad config or missing/mis-shaped weights. With
// `weight_type`, or a GGUF weights file, the linear weights stay in ggml blocks (what was kept
// goes to `quantized`). `stream`: the blocks' weights stay in the memory-mapped files and come
// in block by block as they run (models/block_streaming.h; diffusers-named safetensors only,
// not with quantized weights: InvalidArgument saying why).
FluxTransformer2DModel load_flux_transformer(const io::ModelFolder& folder, torch::Device device,
                                             torch::Dtype dtype,
                                             const std::string& component = "transformer",
                                             std::optional<quant::GgmlType> weight_type = {},
                                             nn::QuantizedLayers* quantized = nullptr,
                                             bool stream = false);

// Latent [B, C, h, w] (h, w even) -> tokens [B, (h/2)(w/2), 4C], row-major over the 2x2-patch
// grid, features ordered (c, py, px) (FluxPipeline._pack_latents).
torch::Tensor flux_pack(const torch::Tensor& latents);
// The inverse: tokens [B, (h/2)(w/2), 4C] -> [B, C, h, w].
torch::Tensor flux_unpack(const torch::Tensor& tokens, int64_t h, int64_t w);
// Position ids [(h/2)(w/2), 3] of a packed h x w latent: (frame, row, col), float32
// (FluxPipeline._prepare_latent_image_ids; Kontext's source image uses frame 1).
torch::Tensor flux_image_ids(int64_t h, int64_t w, float frame = 0.0f);

}  // namespace diffuse::models
