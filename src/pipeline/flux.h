// FLUX.1 text-to-image (diffusers FluxPipeline: dev with its guidance embedding, schnell
// without) and FLUX.1 Kontext instruction editing (FluxKontextPipeline), on CLIP-L + T5, the
// MM-DiT, FlowMatchEulerDiscreteScheduler and the 16-channel VAE of one model folder.
//
// What the reference does and this reproduces: latents are packed 2x2 into tokens with
// position ids (0, row, col); the schedule is sigmas = linspace(1, 1/N, N) shifted by
// mu = calculate_shift(image tokens); the model output is the velocity as it is (not negated);
// "true CFG" (true_cfg_scale > 1 with a negative prompt) adds a second call per step. Kontext
// appends the packed source-image latents (ids (1, row, col)) to the noisy tokens at every step
// and keeps the first part of the output.
#pragma once
#include <torch/types.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "accel/dit_cache.h"
#include "adapters/lora_merger.h"
#include "diffuse/pipeline.h"
#include "io/model_folder.h"
#include "models/autoencoder_kl.h"
#include "models/flux_transformer.h"
#include "parallel/rank_group.h"
#include "pipeline/denoise_extras.h"
#include "pipeline/flux_text.h"
#include "pipeline/inpaint_mask.h"
#include "pipeline/memory_plan_folder.h"
#include "schedulers/scheduler.h"

namespace diffuse::pipeline {

// Whether `path` is a diffusers folder of a FLUX pipeline (model_index.json's class FluxPipeline,
// FluxKontextPipeline, FluxImg2ImgPipeline, ...).
bool is_flux_folder(const std::string& path);

// One denoising step as it ran (for golden checks and progress).
struct FluxStep {
  int index = 0;
  torch::Tensor t;                         // the scheduler's timestep
  torch::Tensor transformer_input;         // packed tokens the transformer saw (Kontext: + image)
  torch::Tensor transformer_timestep;      // t / 1000
  torch::Tensor transformer_out;           // RAW output for the prompt (all tokens)
  torch::Tensor transformer_out_negative;  // true CFG: for the negative prompt
  torch::Tensor latents;                   // packed, after the scheduler step
  torch::Tensor denoised;                  // the step's denoised estimate x0 (packed)
  int64_t latent_height = 0, latent_width = 0;  // what flux_unpack needs for latents/denoised
};
using FluxStepCallback = std::function<StepAction(const FluxStep&)>;

struct FluxSampling {
  int steps = 28;
  // The guidance embedding's value (models with guidance_embeds, FLUX.1-dev); others ignore it.
  double guidance_scale = 3.5;
  // > 1 with a negative prompt: a second transformer call per step on the negative prompt,
  // velocity = neg + true_cfg_scale * (pos - neg).
  double true_cfg_scale = 1.0;
  int64_t max_sequence_length = 512;  // T5 tokens (1..512)
  uint64_t seed = 0;
  // Initial latents [1, C, h, w] (unpacked); drawn from `seed` on the CPU when undefined.
  torch::Tensor latents;
  FluxStepCallback on_step;
  VaeTilingOptions vae_tiling;
  // Skip part of the transformer on some steps (accel/dit_cache.h); off: every block runs.
  DitCacheOptions cache;
};

struct FluxTextToImage {
  std::string prompt;
  std::optional<std::string> negative_prompt;  // none: no true CFG
  // Floored to multiples of 2 x the VAE factor (16), as diffusers does, with a warning.
  int width = 1024, height = 1024;
  FluxSampling sampling;
};

// FluxImg2ImgPipeline: the image noised to the schedule's point `strength` (1: pure noise) and
// denoised from there; the last steps - int(steps * (1 - strength)) steps of the schedule run.
struct FluxImageToImage {
  std::string prompt;
  std::optional<std::string> negative_prompt;
  torch::Tensor image;  // uint8 [H, W, 3], up to 64 MP
  // The output size; 0: the image's, floored to multiples of 16 (the image is resized to it
  // with Pillow's Lanczos, as the reference's image processor does).
  int width = 0, height = 0;
  double strength = 0.6;
  // With a mask: repaint only there (FluxInpaintPipeline's blend of the kept region).
  InpaintOptions inpaint;
  FluxSampling sampling;
};

struct FluxEdit {
  std::string prompt;  // the instruction
  std::optional<std::string> negative_prompt;
  torch::Tensor image;  // the source, uint8 [H, W, 3], up to 64 MP
  // The output size; 0 x 0: the (resized) source's. Either way scaled to about max_area
  // pixels at its aspect ratio, sides floored to multiples of 16 (FluxKontextPipeline).
  int width = 0, height = 0;
  int64_t max_area = 1024 * 1024;
  // Resize the source to the Kontext training resolution with the closest aspect ratio (the
  // reference's default); off: the source keeps its size (floored to multiples of 16).
  bool auto_resize = true;
  // The source already encoded: latents [1, C, h, w] as the transformer takes them (shifted and
  // scaled), e.g. kept from an earlier edit of the same image. Skips the resize and the VAE
  // encode; `image` may then be undefined. Undefined: `image` is encoded.
  torch::Tensor image_latents;
  // With a mask: the edit stays inside it (outside, the source's latents are blended back
  // each step; the output then has the source's size).
  InpaintOptions inpaint;
  FluxSampling sampling;
};

struct FluxResult {
  torch::Tensor latents;  // final latents [1, C, h, w] (float32, CPU)
  torch::Tensor image;    // [1, H, W, 3] float32 in [0, 1] (CPU)
  FluxEmbeddings prompt_embeddings, negative_embeddings;
  torch::Tensor img_ids, txt_ids;  // as the transformer got them (Kontext: with the image's)
  torch::Tensor guidance;          // [1], models with guidance_embeds
  // Kontext: the source as resized (uint8 [h, w, 3]) and its latents (unpacked, packed).
  torch::Tensor source_resized, image_latents, image_latents_packed;
  StageTimings timings;
  std::vector<std::string> warnings;
  bool interrupted = false;
  int steps_run = 0;
  accel::DitCacheStats cache;  // with FluxSampling::cache: what the cache skipped
};

// FLUX.1 Kontext's training resolutions (width, height), ~1 MP each.
const std::vector<std::pair<int, int>>& kontext_resolutions();

class FluxPipeline {
 public:
  // A FLUX folder on `device`: the transformer (`transformer_component`) and text encoders in
  // `dtype`, the VAE in float32 (force_upcast). The text encoders load when first needed and
  // (set_keep_text_encoders(false)) go before the transformer loads. IoError naming the
  // component a folder lacks.
  FluxPipeline(const io::ModelFolder& folder, torch::Device device, torch::Dtype dtype,
               const std::string& transformer_component = "transformer");

  FluxResult text_to_image(const FluxTextToImage& request);
  FluxResult edit(const FluxEdit& request);
  FluxResult image_to_image(const FluxImageToImage& request);

  // Whether the folder is a Kontext (editing) model (model_index.json's class).
  bool is_kontext() const { return kontext_; }
  // (width, height) of a text-to-image request after flooring to size_multiple().
  std::pair<int, int> floored_size(int width, int height) const;
  // The (width, height) an edit's source of W x H is resized to.
  std::pair<int64_t, int64_t> source_size(int64_t width, int64_t height, bool auto_resize) const;
  // The (width, height) of an edit's output (0 x 0: the source's) at `max_area`.
  std::pair<int, int> edit_output_size(int width, int height, int64_t max_area) const;

  // A LoRA on the transformer (peft / diffusers names such as
  // transformer.transformer_blocks.0.attn.to_q.lora_A.weight, or kohya names of the same
  // modules; a file that changes none of its weights is refused) and on CLIP-L (kohya's
  // lora_te1_*, peft's text_encoder.*: merged again whenever the text encoders are loaded
  // again), merged at `scale`; returns what it changed. Refused with quantized weights
  // (nothing plain to merge into). T5 takes no adapters (none are trained for it).
  std::string add_lora(const std::string& path, double scale,
                       const adapters::LoraOptions& options = {});
  void set_scheduler(std::unique_ptr<schedulers::Scheduler> scheduler);
  void set_keep_text_encoders(bool keep) { keep_text_encoders_ = keep; }
  // The transformer's linear weights kept in ggml blocks ("q8_0", "q4_0"; "none": plain),
  // chosen before it loads.
  void set_weight_type(const std::string& type);
  // Transformer weight streaming (models/block_streaming.h), chosen before it loads: "on",
  // "off", or "auto" (default): as the generation's memory plan decides, for diffusers-named
  // safetensors (a BFL single file or a GGUF loads whole). Not with quantized weights or a LoRA (it
  // merges into the weights). "auto" follows the generation's memory plan (pipeline/memory_plan.h).
  void set_weight_streaming(const std::string& mode);
  // What the memory plan may hold (bytes, --max-memory); 0: what the device has free. Each
  // generation plans first and refuses to start when nothing fits.
  void set_max_memory(int64_t bytes) { max_memory_ = bytes; }
  // Whether the loaded transformer streams its blocks.
  bool streams_weights() const { return transformer_ && transformer_->stream != nullptr; }
  const nn::QuantizedLayers& quantized_layers() const { return quantized_; }

  FluxTextEncoders& text_encoders();
  models::FluxTransformer2DModel& transformer();
  models::AutoencoderKL& vae() { return vae_; }
  const schedulers::Scheduler& scheduler() const { return *scheduler_; }
  const models::FluxTransformerConfig& transformer_config() const { return tconfig_; }
  int64_t vae_scale_factor() const;
  // InvalidArgument for a cache this model cannot run (a block range outside its blocks).
  void check_cache(const DitCacheOptions& cache) const;
  // Ulysses sequence parallelism (parallel/ulysses.h): every rank of `group` runs the same
  // generation (same inputs and seed) and each transformer call splits its image tokens (with
  // Kontext's reference tokens) over them; after every step the ranks check that their latents
  // are identical. Null: one device.
  void set_sequence_group(std::shared_ptr<parallel::RankGroup> group);
  // What image sides must be multiples of: twice the VAE factor (the 2x2 packing).
  int64_t size_multiple() const { return 2 * vae_scale_factor(); }

 private:
  FolderPlanOptions plan_options() const;
  // The generation's plan: refuses one that does not fit, records its line in `timings`, frees
  // the transformer if the encoders need its memory.
  void follow_plan(int64_t width, int64_t height, int64_t reference_images,
                   const VaeTilingOptions& vae_tiling, StageTimings& timings);
  FluxEmbeddings encode_prompt(const std::string& prompt, int64_t max_sequence_length);
  // Encodes the prompt (and the negative one when true CFG runs) into `out`; returns whether
  // true CFG runs.
  bool encode_prompts(const std::string& prompt, const std::optional<std::string>& negative,
                      const FluxSampling& s, FluxResult& out);
  torch::Tensor initial_latents(const FluxSampling& s, int64_t h, int64_t w) const;
  // Sets the schedule for `image_tokens` noisy tokens.
  void prepare_schedule(int steps, int64_t image_tokens);
  // Denoises packed `latents` (of an h x w latent) with `image_tokens` (Kontext: the source's
  // packed latents, else undefined) appended; fills out.latents (unpacked) and the timings.
  // `inpaint`: packed kept-region latents, noise and mask (flow_denoise's blend).
  torch::Tensor denoise(const FluxSampling& s, torch::Tensor latents, int64_t h, int64_t w,
                        const torch::Tensor& image_tokens, bool true_cfg, FluxResult& out,
                        int64_t first_step = 0, const InpaintLatents* inpaint = nullptr);
  // The packed latent mask of a prepared inpainting run at h x w latents.
  torch::Tensor packed_mask(const PreparedInpaint& prepared, int64_t h, int64_t w) const;
  // The source image checked, resized to h x w pixels (Pillow's Lanczos) into out.source_resized
  // and encoded (posterior mean, or a sample when `noise` is given) into out.image_latents.
  void encode_source(const torch::Tensor& image, int64_t h, int64_t w,
                     const VaeTilingOptions& tiling, const torch::Tensor& noise, FluxResult& out);
  void check_sampling(const FluxSampling& s) const;
  // Merges a LoRA's CLIP-L part into the loaded encoders (text_ must be set).
  void merge_into_text_encoders(adapters::LoraAdapter part, double scale);

  torch::Device device_;
  torch::Dtype dtype_;
  io::ModelFolder folder_;
  std::string transformer_component_;
  models::FluxTransformerConfig tconfig_;
  bool kontext_ = false;
  bool keep_text_encoders_ = true;
  int64_t max_memory_ = 0;
  std::optional<MemoryPlan> plan_;  // the running generation's
  std::optional<quant::GgmlType> weight_type_;
  std::string weight_streaming_ = "auto";
  nn::QuantizedLayers quantized_;
  std::unique_ptr<FluxTextEncoders> text_;
  models::FluxTransformer2DModel transformer_{nullptr};
  std::shared_ptr<parallel::RankGroup> sequence_group_;
  models::AutoencoderKL vae_{nullptr};
  std::unique_ptr<schedulers::Scheduler> scheduler_;
  std::unique_ptr<adapters::LoraMerger> lora_;
  // The CLIP-L parts of the LoRAs added, merged into each FluxTextEncoders as it loads.
  struct TextEncoderLora {
    adapters::LoraAdapter part;
    double scale;
  };
  std::vector<TextEncoderLora> text_encoder_loras_;
  std::unique_ptr<adapters::LoraMerger> text_encoder_lora_;  // bound to text_'s CLIP-L
};

}  // namespace diffuse::pipeline
