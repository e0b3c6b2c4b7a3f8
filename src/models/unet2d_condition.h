// UNet2DConditionModel (diffusers unets/unet_2d_condition.py), built from its config.json.
// Supports the SD 1.x / 2.x and SDXL families: positional timestep embedding, CrossAttnDownBlock2D
// / DownBlock2D / UNetMidBlock2DCrossAttn / UpBlock2D / CrossAttnUpBlock2D, linear or conv
// transformer projections, several transformer layers per block, and SDXL's added "text_time"
// conditioning. Features outside those families (class embeddings, other added embeddings, ...)
// are rejected with a ConfigError instead of being silently ignored.
#pragma once
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/normalization.h>
#include <torch/types.h>

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "io/json_config.h"
#include "io/model_folder.h"
#include "models/intermediates.h"
#include "nn/activations.h"
#include "nn/embeddings.h"
#include "nn/fused_ops.h"
#include "nn/layers.h"
#include "nn/unet_blocks.h"

namespace diffuse::models {

struct UNet2DConditionConfig {
  std::string source;                // the config file, for messages
  std::vector<int64_t> sample_size;  // [] absent, [s] square, or [h, w]
  int64_t in_channels = 4;
  int64_t out_channels = 4;
  bool center_input_sample = false;
  bool flip_sin_to_cos = true;
  double freq_shift = 0;
  std::vector<std::string> down_block_types;
  std::string mid_block_type = "UNetMidBlock2DCrossAttn";  // "" = no mid block
  std::vector<std::string> up_block_types;                 // empty when encoder_only
  // ControlNetModel: the down path and mid block only (no up path, no output head).
  bool encoder_only = false;
  std::vector<int64_t> block_out_channels;
  // Per down block (index i of the down path; the up path uses them reversed):
  std::vector<int64_t> layers_per_block;
  std::vector<int64_t>
      num_attention_heads;  // resolved from num_attention_heads / attention_head_dim
  std::vector<int64_t> cross_attention_dim;
  std::vector<int64_t> transformer_layers_per_block;
  std::vector<bool> only_cross_attention;
  int64_t downsample_padding = 1;
  double mid_block_scale_factor = 1.0;
  std::string act_fn = "silu";
  int64_t norm_num_groups = 32;
  double norm_eps = 1e-5;
  bool use_linear_projection = false;
  bool upcast_attention = false;
  std::string resnet_time_scale_shift = "default";
  int64_t time_embedding_dim = 0;  // resolved: block_out_channels[0] * 4 unless set
  std::optional<std::string> time_embedding_act_fn;
  std::optional<std::string> timestep_post_act;
  int64_t conv_in_kernel = 3;
  int64_t conv_out_kernel = 3;
  // SDXL (addition_embed_type "text_time"): the pooled text embedding and the time ids (sizes
  // and crop in pixels, or the refiner's aesthetic score), each id embedded sinusoidally in
  // addition_time_embed_dim channels, go through add_embedding and are added to the time
  // embedding. projection_class_embeddings_input_dim = ids x addition_time_embed_dim + the
  // pooled embedding's width.
  bool text_time = false;
  int64_t addition_time_embed_dim = 0;
  int64_t projection_class_embeddings_input_dim = 0;

  // Parses and validates; ConfigError naming the file, key and value on any problem.
  static UNet2DConditionConfig from_json(const io::JsonConfig& cfg);
  // Height and width of the sample must be multiples of this (2^number of upsamplers).
  int64_t spatial_factor() const;
};

// DeepCache's state for one generation: where the shallow branch leaves the network, and the
// deep feature that the last full step recorded there.
struct UNetDeepCache {
  int64_t layer_id = 0;   // cache_layer_id: a down block
  int64_t block_id = 0;   // cache_block_id: one of its skip connections (pairs, then downsampler)
  torch::Tensor feature;  // input of the up resnet that consumes that skip connection
};

// SDXL's added conditioning, for a UNet whose config has addition_embed_type "text_time".
struct UNetAddedConditions {
  torch::Tensor text_embeds;  // [B, pooled width]: the second text encoder's projected output
  torch::Tensor time_ids;     // [B, ids]: (orig h, orig w, crop top, crop left, target h, target w)
};

// What ControlNets add to the UNet (diffusers' down_block_additional_residuals and
// mid_block_additional_residual): one tensor per skip connection of the down path (conv_in's
// output, every resnet/attention output, every downsampler output, in order), added after the
// whole down path ran, and one added to the mid block's output.
struct UNetControlResiduals {
  std::vector<torch::Tensor> down;
  torch::Tensor mid;
};

// The down path's outputs: every skip connection and the mid block's output (the sample after
// the down path when there is no mid block).
struct UNetEncoderOutputs {
  std::vector<torch::Tensor> skips;
  torch::Tensor mid;
};

class UNet2DConditionModelImpl : public torch::nn::Module {
 public:
  explicit UNet2DConditionModelImpl(UNet2DConditionConfig config);

  // sample [B, in_channels, H, W]; timestep 0-d or [1] or [B], integer or floating;
  // encoder_hidden_states [B, N, cross_attention_dim]. Returns [B, out_channels, H, W].
  // With `intermediates`, records time_proj, time_embedding, conv_in, down_blocks.i,
  // mid_block, up_blocks.i and conv_norm_out (and add_embedding for SDXL). InvalidArgument on
  // malformed inputs, and when `added` is missing for a text_time UNet or given to another.
  // Inputs are converted to the weights' device and dtype; the result has that dtype.
  // `control`: ControlNet residuals (InvalidArgument when their count or shapes do not fit).
  torch::Tensor forward(const torch::Tensor& sample, const torch::Tensor& timestep,
                        const torch::Tensor& encoder_hidden_states,
                        Intermediates* intermediates = nullptr,
                        const UNetAddedConditions* added = nullptr,
                        const UNetControlResiduals* control = nullptr);
  // The encoder half alone (what a ControlNet runs); `hint` (optional) is added to conv_in's
  // output before the down path, as ControlNet's conditioning embedding is.
  UNetEncoderOutputs forward_encoder(const torch::Tensor& sample, const torch::Tensor& timestep,
                                     const torch::Tensor& encoder_hidden_states,
                                     const std::function<torch::Tensor(const torch::Tensor&)>& hint,
                                     Intermediates* intermediates = nullptr,
                                     const UNetAddedConditions* added = nullptr);

  // DeepCache: with `full`, the whole network (the same result as forward()), recording the
  // deep feature in `cache`; otherwise only the shallow branch (conv_in, the down path to the
  // cached block, the up path from there) on cache.feature. InvalidArgument when the ids are
  // out of range or a shallow step has no feature of the right shape.
  torch::Tensor forward_deep_cache(const torch::Tensor& sample, const torch::Tensor& timestep,
                                   const torch::Tensor& encoder_hidden_states, bool full,
                                   UNetDeepCache& cache,
                                   const UNetAddedConditions* added = nullptr);

  const UNet2DConditionConfig& config() const { return config_; }

  nn::Conv2d conv_in{nullptr}, conv_out{nullptr};
  nn::Timesteps time_proj{nullptr};
  nn::TimestepEmbedding time_embedding{nullptr};
  nn::Timesteps add_time_proj{nullptr};          // SDXL only
  nn::TimestepEmbedding add_embedding{nullptr};  // SDXL only
  torch::nn::ModuleList down_blocks{nullptr}, up_blocks{nullptr};
  std::vector<nn::DownBlock2D> down_list;
  nn::UNetMidBlock2DCrossAttn mid_block{nullptr};
  std::vector<nn::UpBlock2D> up_list;
  nn::GroupNorm conv_norm_out{nullptr};

 private:
  void check_inputs(const torch::Tensor& sample, const torch::Tensor& timestep,
                    const torch::Tensor& encoder_hidden_states) const;
  // The part every forward shares: inputs on the weights' device and dtype, the time
  // embedding and conv_in.
  struct Prepared {
    torch::Tensor sample, emb, ctx;
  };
  Prepared prepare(const torch::Tensor& sample, const torch::Tensor& timestep,
                   const torch::Tensor& encoder_hidden_states, Intermediates* intermediates,
                   const UNetAddedConditions* added);
  // SDXL's aug_emb: add_embedding(cat(text_embeds, sinusoidal(time_ids))), [B, temb channels].
  torch::Tensor added_embedding(const UNetAddedConditions* added, int64_t batch,
                                const torch::Tensor& like);
  torch::Tensor output_head(torch::Tensor sample, Intermediates* intermediates);

  UNet2DConditionConfig config_;
  nn::Activation act_;
  std::optional<nn::Activation> time_embed_act_;
};
TORCH_MODULE(UNet2DConditionModel);

// Builds the model from `<component>/config.json`, loads its weights by name, and moves it to
// `device` / `dtype` in eval mode. ConfigError / FormatError / IoError name the file.
UNet2DConditionModel load_unet(const io::ModelFolder& folder, torch::Device device,
                               torch::Dtype dtype, const std::string& component = "unet");

}  // namespace diffuse::models
