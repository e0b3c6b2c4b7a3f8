// Internals of the single-file (LDM layout) loader, see io/ldm_checkpoint.h for the layout.
// Parsing reads the structure of each component from its key names and shapes; mapping moves
// tensors out of the LDM-named pool into diffusers names, so whatever is left in the pool
// afterwards is a key no rule understood.
#pragma once
#include <torch/types.h>

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace diffuse::io::ldm {

using TensorMap = std::map<std::string, torch::Tensor>;

// Key prefixes of the components in a single-file checkpoint.
inline const std::string kUnetPrefix = "model.diffusion_model.";
inline const std::string kVaePrefix = "first_stage_model.";
inline const std::string kOpenClipPrefix = "cond_stage_model.model.";    // SD2
inline const std::string kClipPrefix = "cond_stage_model.transformer.";  // SD1
// SDXL (generative-models' conditioner): CLIP-L in transformers names and OpenCLIP ViT-bigG;
// the refiner has only the latter, as embedder 0.
inline const std::string kSdxlClipLPrefix = "conditioner.embedders.0.transformer.";
inline const std::string kSdxlClipGPrefix = "conditioner.embedders.1.model.";
inline const std::string kSdxlRefinerClipGPrefix = "conditioner.embedders.0.model.";

// ---- UNet (keys without the "model.diffusion_model." prefix) ----

struct UnetLevel {
  int64_t channels = 0;
  std::vector<int> blocks;  // input_blocks / output_blocks indices of this level's resnets
  bool attention = false;   // each resnet entry is followed by a spatial transformer
  int resample_block = -1;  // input_blocks index of the downsampler / output_blocks index
                            // whose entry holds the upsampler; -1 if none
  int resample_slot = -1;   // output blocks: sub-index of the upsampler conv (1 or 2)
  int transformer_depth = 0;
};

struct UnetLayout {
  int64_t in_channels = 0, out_channels = 0, time_embed_dim = 0;
  std::vector<UnetLevel> down;  // in diffusers order (down_blocks.0 first)
  std::vector<UnetLevel> up;    // in diffusers order (up_blocks.0 = deepest level first)
  int mid_transformer_depth = 0;
  bool use_linear_projection = false;
  int64_t cross_attention_dim = 0;
};

// Throws FormatError (naming `source`) when the keys do not form an LDM UNet. `encoder_only`:
// the input blocks and middle block alone (a ControlNet's copy of the UNet: no output path).
UnetLayout parse_unet_layout(const TensorMap& unet, const std::string& source,
                             bool encoder_only = false);
// Moves the UNet tensors out of `pool` into diffusers names; with `sources`, also records each
// diffusers name's key in `pool` (a mapping table for files read tensor by tensor).
TensorMap map_unet(TensorMap& pool, const UnetLayout& layout, const std::string& source,
                   std::map<std::string, std::string>* sources = nullptr);

// ---- ControlNet (the original ControlNet checkpoints' keys, without "control_model.") ----

struct ControlNetLayout {
  UnetLayout unet;                     // encoder_only
  int64_t conditioning_channels = 0;   // input_hint_block.0's input channels
  std::vector<int64_t> hint_channels;  // conditioning_embedding_out_channels
  int hint_last = 0;                   // input_hint_block index of the last (zero) conv
};

// input_blocks/middle_block as a UNet's, input_hint_block's convolutions (indices 0, 2, ...,
// every other one a SiLU), zero_convs.N.0 and middle_block_out.0. FormatError naming `source`.
ControlNetLayout parse_controlnet_layout(const TensorMap& pool, const std::string& source);
// Moves the ControlNet's tensors out of `pool` into diffusers' ControlNetModel names.
TensorMap map_controlnet(TensorMap& pool, const ControlNetLayout& layout,
                         const std::string& source);

// ---- VAE (keys without "first_stage_model.") ----

struct VaeLayout {
  int64_t in_channels = 0, out_channels = 0, latent_channels = 0;
  std::vector<int64_t> block_out_channels;  // encoder order
  int layers_per_block = 0;                 // encoder resnets per level; decoder has one more
};

VaeLayout parse_vae_layout(const TensorMap& vae, const std::string& source);
TensorMap map_vae(TensorMap& pool, const VaeLayout& layout, const std::string& source);

// ---- Text encoders ----

struct TextLayout {
  bool open_clip = false;  // SD2 OpenCLIP layout; else transformers CLIP names (SD1)
  int64_t hidden_size = 0, intermediate_size = 0, vocab_size = 0, max_positions = 0;
  int layers_in_file = 0;
  bool has_text_projection = false;  // OpenCLIP: the file holds the whole text tower
};

// `pool` holds keys without their prefix ("cond_stage_model.model." for OpenCLIP,
// "cond_stage_model.transformer." for CLIP, unless `prefix` names another, as SDXL's
// conditioner does; errors name keys with it).
TextLayout parse_text_layout(const TensorMap& pool, bool open_clip, const std::string& source,
                             const std::string& prefix = "");
// Moves the first `num_layers` layers (and embeddings / final norm) out of `pool`; the
// remaining resblocks of an OpenCLIP tower are removed as unused. `with_projection`: an
// OpenCLIP tower's text_projection (applied as x @ P) becomes CLIPTextModelWithProjection's
// text_projection.weight (P transposed), as SDXL's second encoder needs; else it is dropped.
TensorMap map_text(TensorMap& pool, const TextLayout& layout, int num_layers,
                   const std::string& source, bool with_projection = false);

// ---- Configs (io/ldm_config_infer.cpp) ----

// Inferred diffusers/transformers configs. Values the weights cannot determine take the
// standard SD1/SD2 value and are appended to `assumed` as "<component>.<key>".
nlohmann::json infer_unet_config(const UnetLayout& layout, const std::string& family,
                                 bool v_prediction, std::vector<std::string>* assumed);
nlohmann::json infer_vae_config(const VaeLayout& layout, const std::string& family,
                                bool v_prediction, std::vector<std::string>* assumed);
nlohmann::json infer_text_config(const TextLayout& layout, int num_layers,
                                 std::vector<std::string>* assumed);
nlohmann::json default_scheduler_config(bool v_prediction);

// Checks that a given config agrees with the inferred one on every key the weights determine;
// throws ConfigError naming `config_source`, the key and both values. Keys absent from the
// given config are not checked.
void check_config_against_weights(const nlohmann::json& given, const nlohmann::json& inferred,
                                  const std::vector<std::string>& keys,
                                  const std::string& config_source, const std::string& weights);

// The keys of each config that shapes determine (what check_config_against_weights compares).
const std::vector<std::string>& unet_shape_keys();
const std::vector<std::string>& vae_shape_keys();
const std::vector<std::string>& text_shape_keys();

}  // namespace diffuse::io::ldm
