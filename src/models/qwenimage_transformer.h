// QwenImageTransformer2DModel (diffusers transformers/transformer_qwenimage.py): the 20B MMDiT
// of Qwen-Image and Qwen-Image-Edit, built from its config.json with diffusers' module names.
// Its double-stream blocks compute what FLUX's do (nn/flux_blocks.h, with Qwen's names); the
// rest: the text RMSNorm and projections, the timestep embedding (t given as t/1000, scaled
// back inside the sinusoid), a 3-axis RoPE built from the image grids with centred row and
// column positions, and text positions after the largest half grid.
//
// It works on packed latents [B, S, in_channels] (2x2 patches, models::flux_pack); an edit's
// sequence is the noisy target's tokens followed by the source image's, one grid per image.
#pragma once
#include <torch/nn/module.h>
#include <torch/types.h>

#include <array>
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
#include "nn/fused_ops.h"
#include "nn/layers.h"
#include "nn/rope.h"

namespace diffuse::accel {
class DitCache;
}
namespace diffuse::parallel {
class RankGroup;
}

namespace diffuse::models {

// QwenEmbedRope's theta (diffusers hard-codes it).
constexpr double kQwenImageRopeTheta = 10000.0;

struct QwenImageTransformerConfig {
  std::string source;
  int64_t patch_size = 2;
  int64_t in_channels = 64;
  int64_t out_channels = 16;
  int64_t num_layers = 60;
  int64_t attention_head_dim = 128;
  int64_t num_attention_heads = 24;
  int64_t joint_attention_dim = 3584;
  std::vector<int64_t> axes_dims_rope{16, 56, 56};

  // ConfigError naming the file and key; also for what this build does not run
  // (guidance_embeds, zero_cond_t of Qwen-Image-Edit-2511, additional_t_cond, layer3d rope).
  static QwenImageTransformerConfig from_json(const io::JsonConfig& cfg);
  int64_t inner_dim() const { return num_attention_heads * attention_head_dim; }
  nn::FluxBlockOptions block_options() const;
};

// One image of the sequence: (frames, rows, cols) of its packed token grid.
using QwenImageGrid = std::array<int64_t, 3>;

struct QwenImageForwardOptions {
  accel::DitCache* cache = nullptr;  // null: every block runs
  // Ulysses sequence parallelism: every rank of the group makes this call with the same
  // inputs; each runs its share of the image tokens and all get the whole output.
  parallel::RankGroup* sequence_group = nullptr;
};

class QwenImageTransformer2DModelImpl : public torch::nn::Module {
 public:
  explicit QwenImageTransformer2DModelImpl(QwenImageTransformerConfig config);

  // hidden_states [B, S, in_channels], S = the grids' tokens; timestep [B] or one value
  // (sigma = t/1000, as the pipelines pass it); encoder_hidden_states [B, L,
  // joint_attention_dim]. Returns [B, S, patch^2 * out_channels]. InvalidArgument naming the
  // input and the expected shape. With `intermediates`: img_in, txt_in, time_text_embed,
  // transformer_blocks.i.{text,image}, norm_out.
  torch::Tensor forward(const torch::Tensor& hidden_states, const torch::Tensor& timestep,
                        const torch::Tensor& encoder_hidden_states,
                        const std::vector<QwenImageGrid>& img_shapes,
                        const QwenImageForwardOptions& options = {},
                        Intermediates* intermediates = nullptr);

  const QwenImageTransformerConfig& config() const { return config_; }

  std::vector<nn::FluxTransformerBlock> blocks;
  std::shared_ptr<BlockWeightStream> stream;  // load_qwenimage_transformer(..., stream = true)

  nn::TimestepEmbedding timestep_embedder{nullptr};
  nn::RMSNorm txt_norm{nullptr};
  nn::Linear img_in{nullptr}, txt_in{nullptr};
  nn::Linear norm_out_linear{nullptr}, proj_out{nullptr};

 private:
  QwenImageTransformerConfig config_;
};
TORCH_MODULE(QwenImageTransformer2DModel);

// The rotary table of the joint [text | image] sequence (QwenEmbedRope with scale_rope): image
// i's tokens get (frame i + f, row - rows/2 rounded, col - cols/2 rounded) positions, the text
// tokens (m + j) on every axis with m = the largest half grid side; angles in float32 as the
// reference computes them.
nn::RopeTable qwenimage_rope_table(const std::vector<QwenImageGrid>& img_shapes, int64_t text_len,
                                   const std::vector<int64_t>& axes_dims,
                                   const torch::Device& device);

bool is_qwenimage_transformer(const io::ModelFolder& folder,
                              const std::string& component = "transformer");

// Loads `<component>/` onto `device` in `dtype` (diffusers names; files whose keys carry
// ComfyUI's "model.diffusion_model." prefix too). With `weight_type`, or a GGUF file, the linear
// weights stay in ggml blocks. `stream`: the blocks' weights come in block by block as they run.
QwenImageTransformer2DModel load_qwenimage_transformer(
    const io::ModelFolder& folder, torch::Device device, torch::Dtype dtype,
    const std::string& component = "transformer", std::optional<quant::GgmlType> weight_type = {},
    nn::QuantizedLayers* quantized = nullptr, bool stream = false);

}  // namespace diffuse::models
