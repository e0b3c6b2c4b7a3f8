// HiDreamImageTransformer2DModel (diffusers transformers/transformer_hidream_image.py): the
// sparse DiT of HiDream-I1/E1, built from its config.json with diffusers' module names so that
// transformer/diffusion_pytorch_model*.safetensors (sharded with an index json, as on the hub)
// load by name.
//
// Text conditioning: T5's last hidden state and a stack of Llama hidden states. Each listed
// Llama layer gets its own caption_projection; the T5 projection comes last. The text stream
// starts as [T5 | last listed Llama layer]; every block (dual-stream i, then single-stream j)
// appends "its" projected Llama layer for one block and drops it again.
#pragma once
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
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
#include "nn/hidream_blocks.h"
#include "nn/layers.h"

namespace diffuse::accel {
class DitCache;
}
namespace diffuse::parallel {
class RankGroup;
}

namespace diffuse::models {

struct HiDreamTransformerConfig {
  std::string source;  // the config file, for messages
  int64_t patch_size = 2;
  int64_t in_channels = 64;
  int64_t out_channels = 64;       // config null -> in_channels
  int64_t num_layers = 16;         // dual-stream blocks
  int64_t num_single_layers = 32;  // single-stream blocks
  int64_t attention_head_dim = 128;
  int64_t num_attention_heads = 20;
  std::vector<int64_t> caption_channels;  // [T5 d_model, Llama hidden size]
  int64_t text_emb_dim = 2048;            // pooled CLIP-L + CLIP-G projections
  int64_t num_routed_experts = 4;
  int64_t num_activated_experts = 2;
  std::vector<int64_t> axes_dims_rope{32, 32};
  std::vector<int64_t> max_resolution{128, 128};  // in latent pixels
  std::vector<int64_t> llama_layers;              // one Llama hidden-state index per block

  // Parses and validates; ConfigError naming the file, key and value on any problem.
  static HiDreamTransformerConfig from_json(const io::JsonConfig& cfg);
  int64_t inner_dim() const { return num_attention_heads * attention_head_dim; }
  // What every block of this model is built from.
  nn::HiDreamBlockOptions block_options() const;
  // Image tokens the position table was built for: max_resolution[0] * [1] / patch_size^2.
  int64_t max_seq() const;
};

// RoPE for a pH x pW grid of image tokens at positions (frame 0, row, col), row-major, with
// the config's axes (theta 10000). Text and padding tokens sit at (0, 0, 0): the identity.
nn::RopeTable hidream_image_rope(const HiDreamTransformerConfig& config, int64_t pH, int64_t pW,
                                 const torch::Device& device);

struct HiDreamForwardOptions {
  // Token count non-square latents are padded to; 0 = the config's max_seq(). HiDream-E1 sets
  // it to the exact token count of its side-by-side input (no padding).
  int64_t max_seq = 0;
  // A DiT cache (accel/dit_cache.h) this call consults and updates: blocks it skips add the
  // residual or forecast kept from full steps. Null: every block runs.
  accel::DitCache* cache = nullptr;
  // Ulysses sequence parallelism (parallel/ulysses.h): every rank of the group makes this call
  // with the same inputs; each runs its share of the image tokens and all get the whole
  // output. Null: one device. Not with `intermediates`.
  parallel::RankGroup* sequence_group = nullptr;
};

class HiDreamImageTransformer2DModelImpl : public torch::nn::Module {
 public:
  explicit HiDreamImageTransformer2DModelImpl(HiDreamTransformerConfig config);

  // hidden_states [B, in_channels, H, W] (H, W multiples of patch_size); timesteps [B] or
  // [1] or 0-d, float (sigma * 1000); t5 [B, L5, caption_channels[0]]; llama
  // [n_layers, B, Ll, caption_channels[1]] (the pipeline's stack of hidden_states[1:]);
  // pooled [B, text_emb_dim]. Returns the RAW model output [B, out_channels, H, W] (the
  // pipelines negate it). Square latents run unpadded; non-square ones are padded to max_seq
  // tokens with the key-only mask, as diffusers does. InvalidArgument (naming the input and
  // the expected shape) on malformed inputs or a latent with more tokens than max_seq.
  // With `intermediates`: x_embedder, t_embedder, p_embedder, caption_projection.i,
  // pe_embedder, double_stream_blocks.i.{image,text}, single_stream_blocks.i, final_layer.
  torch::Tensor forward(const torch::Tensor& hidden_states, const torch::Tensor& timesteps,
                        const torch::Tensor& t5, const torch::Tensor& llama,
                        const torch::Tensor& pooled, const HiDreamForwardOptions& options = {},
                        Intermediates* intermediates = nullptr);

  const HiDreamTransformerConfig& config() const { return config_; }

  // Blocks, for benchmarks and weight streaming (registered as "<list>.i.block").
  std::vector<nn::HiDreamImageTransformerBlock> double_blocks;
  std::vector<nn::HiDreamImageSingleTransformerBlock> single_blocks;
  // Set by load_hidream_transformer(..., stream = true): the blocks' weights come in from the
  // files as they run (double blocks first, then single blocks).
  std::shared_ptr<BlockWeightStream> stream;

  // The embedders, caption projections and output head (read by the ONNX export, src/export).
  nn::Timesteps time_proj{nullptr};
  nn::TimestepEmbedding timestep_embedder{nullptr}, pooled_embedder{nullptr};
  nn::Linear x_proj{nullptr};
  std::vector<nn::Linear> caption_linear;  // one per block (its Llama layer), then T5's
  nn::Linear final_linear{nullptr}, final_modulation{nullptr};

 private:
  void check_inputs(const torch::Tensor& x, const torch::Tensor& timesteps, const torch::Tensor& t5,
                    const torch::Tensor& llama, const torch::Tensor& pooled, int64_t max_seq) const;

  HiDreamTransformerConfig config_;
};
TORCH_MODULE(HiDreamImageTransformer2DModel);

// Builds the model from `<component>/config.json`, loads its weights by name, and moves it to
// `device` / `dtype` in eval mode. ConfigError / FormatError / IoError name the file.
// `stream`: the blocks' weights stay in the memory-mapped files and come in block by block as
// they run (models/block_streaming.h); the rest (embedders, caption projections, final layer)
// is loaded as usual.
// `weight_type` (or a GGUF weights file): the linear layers' weights are kept in ggml blocks
// as they load (models::load_component_weights_quantized; the plain weights are never all in
// memory), reported in `*quantized`. Not with `stream`.
HiDreamImageTransformer2DModel load_hidream_transformer(
    const io::ModelFolder& folder, torch::Device device, torch::Dtype dtype,
    const std::string& component = "transformer", bool stream = false,
    std::optional<quant::GgmlType> weight_type = std::nullopt,
    nn::QuantizedLayers* quantized = nullptr);

}  // namespace diffuse::models
