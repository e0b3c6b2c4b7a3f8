// `diffuse export onnx`: one component of a diffusers folder as a standard ONNX file, written
// from the engine's own modules (onnx_modules.h), for ONNX Runtime, TensorRT or Ascend's ATC
// (docs/ascend.md). Inputs and outputs carry the names diffusers' and Optimum's exports use:
//   text_encoder[_2]  input_ids [B, S] int64 -> last_hidden_state [B, S, C], pooler_output
//                     [B, C], text_embeds [B, P] (with a projection), hidden_states.0..L;
//                     T5 (FLUX's text_encoder_2, HiDream's _3): input_ids, attention_mask
//                     [B, S] int64 -> last_hidden_state (fp32 only); Llama (HiDream's
//                     text_encoder_4): input_ids, attention_mask -> hidden_states.0..L
//   unet              sample [B, c, h, w], timestep [B] float32, encoder_hidden_states
//                     [B, S, D] (+ text_embeds, time_ids for SDXL) -> out_sample; with
//                     control_residuals also down_block_additional_residuals.0..n-1 and
//                     mid_block_additional_residual (a ControlNet's outputs, added)
//   controlnet        the unet's inputs + controlnet_cond [B, 3, H, W] in [0, 1] and
//                     conditioning_scale float32 [n + 1] (one factor per residual, guess mode's
//                     logspace or the scale repeated) -> down_block_res_samples.0..n-1,
//                     mid_block_res_sample
//   vae_decoder       latent_sample [B, c, h, w] -> sample [B, 3, H, W] (post_quant_conv
//                     included; scaling_factor is the pipeline's, as in the engine)
//   vae_encoder       sample [B, 3, H, W] -> latent_parameters [B, 2c, h, w] (mean | logvar)
//   transformer       FLUX.1: hidden_states [B, S, 64] (packed latents), encoder_hidden_states
//                     [B, L, 4096], pooled_projections [B, 768], timestep [B] (t / 1000),
//                     img_ids [S, 3], txt_ids [L, 3] (+ guidance [B] for dev) -> out_hidden_states
//                     HiDream: hidden_states [B, 16, h, w], timesteps [B], encoder_hidden_states_t5
//                     [B, L, 4096], encoder_hidden_states_llama3 [layers, B, L, 4096],
//                     pooled_embeds [B, 2048] -> out_hidden_states [B, 16, h, w] (not negated)
#pragma once
#include <torch/types.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace diffuse::onnx_export {

struct ExportRequest {
  std::string model_dir;
  // text_encoder | text_encoder_2 | unet | controlnet | vae_decoder | vae_encoder | transformer
  std::string component;
  std::string output;  // FILE.onnx
  int opset = 17;
  std::string precision = "fp32";  // fp32 | fp16
  // Static shapes (what ATC prefers): image size in pixels (0: the UNet's sample_size times the
  // VAE's factor), batch, text length (0: the text encoder's max_position_embeddings).
  int64_t batch = 1, height = 0, width = 0, tokens = 0;
  // HiDream: image tokens a non-square latent is padded to (0: the config's max_seq). HiDream-E1
  // runs its side-by-side input unpadded: its token count.
  int64_t max_seq = 0;
  bool dynamic = false;            // symbolic batch/height/width/sequence instead
  bool control_residuals = false;  // unet: take a ControlNet's residuals as inputs
  bool external_data = false;      // weights in FILE.onnx.data even below 2 GiB
  bool overwrite = false;          // replace existing files instead of refusing
};

// A graph input or output as written: dims of -1 are symbolic (--dynamic).
struct TensorSpec {
  std::string name;
  torch::Dtype dtype;
  std::vector<int64_t> dims;
  std::string describe() const;  // "sample float32 [1, 4, 64, 64]" (symbols as -1)
};

struct ExportResult {
  std::string model_path, data_path;
  int64_t model_bytes = 0, data_bytes = 0, weight_bytes = 0;
  std::map<std::string, int64_t> op_counts;
  std::vector<TensorSpec> inputs, outputs;
};

// The components a folder can export, in order ("unet", "vae_decoder", ...).
std::vector<std::string> exportable_components(const std::string& model_dir);

// Loads the component in float32 on the CPU, writes its graph and weights, and checks that
// every parameter of the module went into the file. InvalidArgument for an unknown or
// unsupported component, bad sizes or opset (before anything is written), IoError when the
// output exists (without `overwrite`) or cannot be written; nothing half-written is left.
ExportResult export_onnx(const ExportRequest& request);

}  // namespace diffuse::onnx_export
