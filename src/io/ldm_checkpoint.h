// Single-file Stable Diffusion checkpoints (the original CompVis / Stability "LDM" key layout,
// as safetensors) turned into diffusers / transformers state dicts plus configs, so the same
// model code that loads a diffusers folder loads these by name. Nothing here builds a model.
//
// Layout of such a file (prefix -> component):
//   model.diffusion_model.*   UNet (openaimodel.UNetModel)
//     time_embed.{0,2}                       -> time_embedding.linear_{1,2}
//     input_blocks.0.0                       -> conv_in
//     input_blocks.N.0 (resnet)              -> down_blocks.L.resnets.R
//         in_layers.0/in_layers.2/emb_layers.1/out_layers.0/out_layers.3/skip_connection
//         -> norm1/conv1/time_emb_proj/norm2/conv2/conv_shortcut
//     input_blocks.N.1 (SpatialTransformer)  -> down_blocks.L.attentions.R (same inner names)
//     input_blocks.N.0.op                    -> down_blocks.L.downsamplers.0.conv
//     middle_block.{0,1,2}                   -> mid_block.{resnets.0, attentions.0, resnets.1}
//     output_blocks.N.0 / .1 (attention)     -> up_blocks.L.resnets.R / attentions.R
//     output_blocks.N.{1|2}.conv (upsample)  -> up_blocks.L.upsamplers.0.conv
//     out.0 / out.2                          -> conv_norm_out / conv_out
//   The numbering N runs through all levels in order: each down level is `layers_per_block`
//   resnet entries then one downsampler entry (none after the last level); each up level is
//   `layers_per_block + 1` entries, the last of which also holds the upsampler (none in the
//   last level). Levels, resnets per level, attention per level, channels, use_linear_projection
//   (proj_in is a 2-D Linear vs a 1x1 conv) and cross_attention_dim (attn2.to_k) are read from
//   the keys and shapes, never assumed.
//   first_stage_model.*       VAE (AutoencoderKL)
//     encoder.down.L.block.R      -> encoder.down_blocks.L.resnets.R
//     encoder.down.L.downsample   -> encoder.down_blocks.L.downsamplers.0
//     decoder.up.L.*              -> decoder.up_blocks.(num_levels-1-L).*  (LDM numbers up
//                                    levels from the full-resolution end, diffusers in
//                                    execution order); up.L.upsample -> upsamplers.0
//     {encoder,decoder}.mid.block_{1,2} / mid.attn_1 -> mid_block.resnets.{0,1} / attentions.0
//     attn_1.norm/q/k/v/proj_out -> group_norm/to_q/to_k/to_v/to_out.0 (1x1 conv weights
//                                    [C,C,1,1] are squeezed to Linear [C,C])
//     nin_shortcut -> conv_shortcut; norm_out -> conv_norm_out; quant_conv, post_quant_conv
//     and conv_in/conv_out keep their names.
//   cond_stage_model.transformer.*  SD1.x text encoder: already transformers CLIPTextModel
//                                    names ("text_model.*"): the prefix is stripped.
//   cond_stage_model.model.*        SD2.x text encoder, OpenCLIP layout -> CLIPTextModel:
//     token_embedding / positional_embedding / ln_final -> text_model.embeddings.token_embedding /
//     .position_embedding / text_model.final_layer_norm; transformer.resblocks.I.{ln_1, ln_2,
//     attn.in_proj_* (q,k,v stacked on dim 0), attn.out_proj, mlp.c_fc, mlp.c_proj} ->
//     text_model.encoder.layers.I.{layer_norm1, layer_norm2, self_attn.{q,k,v}_proj,
//     self_attn.out_proj, mlp.fc1, mlp.fc2}.
//     SD2 conditions on the penultimate layer. A file saved by the original training code holds
//     the whole OpenCLIP text tower (its last resblock, never run by SD2, plus text_projection
//     and logit_scale); a file converted back from diffusers holds only the layers that are
//     used. diffusers' own converter builds a 23-layer CLIPTextModel from the hub config and
//     drops resblocks.23. Here: with a config folder, layers beyond its num_hidden_layers are
//     dropped (at most one); without one, the last resblock is dropped iff text_projection is
//     present (the mark of a full tower).
//   SDXL (generative-models' layout; needs a config folder for its configs and tokenizers):
//     model.diffusion_model.label_emb.0.{0,2}  -> add_embedding.linear_{1,2} (the rest as above)
//     conditioner.embedders.0.transformer.*    -> text_encoder (CLIP-L, transformers names)
//     conditioner.embedders.1.model.*          -> text_encoder_2 (OpenCLIP ViT-bigG as above,
//                                                 every layer kept, text_projection transposed
//                                                 into text_projection.weight)
//     conditioner.embedders.0.model.*          -> a refiner's only encoder, text_encoder_2
//   Ignored: DDPM schedule buffers (betas, alphas_cumprod, ...), model_ema.*, text_projection,
//   logit_scale, attn_mask, position_ids, first_stage_model.loss.* (training-only). Any other
//   key that no rule consumes is an error, so a layout we do not understand never half-loads.
#pragma once
#include <torch/types.h>

#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace diffuse::io {

struct SingleFileComponents {
  // State dicts with diffusers (unet, vae) / transformers (text_encoder) parameter names.
  // vae / text_encoder are empty (and their configs null) when the file has no such part.
  // SDXL: text_encoder is CLIP-L (empty for a refiner), text_encoder_2 the OpenCLIP ViT-bigG
  // as CLIPTextModelWithProjection (empty and null for SD1/SD2).
  std::map<std::string, torch::Tensor> unet, vae, text_encoder, text_encoder_2;
  // diffusers config.json contents: inferred from shapes unless a config folder was given.
  nlohmann::json unet_config, vae_config, text_encoder_config, text_encoder_2_config,
      scheduler_config;
  nlohmann::json model_index;  // the config folder's, when one was given
  std::string family;          // "sd1" | "sd2" | "sdxl" | "sdxl-refiner"
  // Inferred config values that the weights cannot determine and were set to the standard
  // SD1/SD2 value (e.g. "unet.attention_head_dim", "unet.norm_num_groups"); empty when a
  // config folder was used. Callers may warn: a model with non-standard values needs one.
  std::vector<std::string> assumed;
};

struct SingleFileOptions {
  // Optional diffusers pipeline folder (model_index.json + <component>/config.json): its
  // configs are used instead of inferred ones (after checking them against the weights).
  std::string config_dir;
  // Overrides the scheduler's prediction_type (true: v_prediction, false: epsilon). Unset: the
  // config folder's scheduler config decides if there is one, else the file's metadata
  // (modelspec.prediction_type, ss_v_parameterization, a "v_pred" tensor), else epsilon.
  // (diffusers' from_single_file assumes SD 2.1-768's v_prediction for every SD2 file; we do
  // not guess: 2.x-base files are epsilon.)
  std::optional<bool> v_prediction;
  // The UNet's tensors are not read: SingleFileComponents::unet holds storage-less (meta)
  // tensors of their shapes, for a caller that reads them itself (a GGUF's quantized blocks
  // kept as stored, io/unet_file.h).
  bool unet_shapes_only = false;
};

// Loads and maps a single-file checkpoint. Throws IoError (cannot read), FormatError (not a
// safetensors file, no model.diffusion_model.* keys, a pickle .ckpt, unmapped keys, an
// unsupported variant), ConfigError (config folder disagrees with the weights).
SingleFileComponents load_single_file_checkpoint(const std::string& path,
                                                 const SingleFileOptions& options = {});

// True if `path` is a readable safetensors or GGUF file with model.diffusion_model.* keys.
// Never throws.
bool is_single_file_checkpoint(const std::string& path);
// Whether the file starts with GGUF's magic. Never throws.
bool is_gguf_file(const std::string& path);

}  // namespace diffuse::io
