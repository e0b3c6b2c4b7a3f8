// Qwen-Image text-to-image (diffusers QwenImagePipeline) and Qwen-Image-Edit instruction editing
// (QwenImageEditPipeline) on Qwen2.5-VL, the Qwen-Image MMDiT, FlowMatchEulerDiscreteScheduler
// and the causal-3D VAE of one model folder.
//
// What the reference does and this reproduces: latents packed 2x2 into tokens; the schedule
// sigmas = linspace(1, 1/N, N) shifted by mu = calculate_shift(noisy tokens) (exponential
// shift, stretched to shift_terminal); the transformer takes t/1000; "true CFG" (true_cfg_scale
// > 1 with a negative prompt) runs a second call per step and rescales the combination to the
// conditional prediction's norm per token. An edit resizes the source to ~1 MP (multiples of
// 32, Lanczos), shows it to Qwen2.5-VL inside the prompt and appends its packed, normalised
// latents to the noisy tokens of every call, keeping the first part of the output.
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
#include "models/autoencoder_kl_qwenimage.h"
#include "models/qwenimage_transformer.h"
#include "parallel/rank_group.h"
#include "pipeline/denoise_extras.h"
#include "pipeline/inpaint_mask.h"
#include "pipeline/memory_plan_folder.h"
#include "pipeline/qwenimage_text.h"
#include "schedulers/scheduler.h"

namespace diffuse::pipeline {

// Whether `path` is a diffusers folder of a Qwen-Image pipeline (model_index.json's class
// QwenImagePipeline, QwenImageEditPipeline, ...).
bool is_qwenimage_folder(const std::string& path);

struct QwenImageStep {
  int index = 0;
  torch::Tensor t;                         // the scheduler's timestep
  torch::Tensor transformer_timestep;      // t / 1000
  torch::Tensor transformer_out;           // the prompt's call, every token (edit: + source)
  torch::Tensor transformer_out_negative;  // true CFG: the negative prompt's
  torch::Tensor latents;                   // packed, after the scheduler step
  torch::Tensor denoised;                  // the step's x0 estimate (packed)
  int64_t latent_height = 0, latent_width = 0;
};
using QwenImageStepCallback = std::function<StepAction(const QwenImageStep&)>;

struct QwenImageSampling {
  int steps = 50;
  // > 1 with a negative prompt: a second call per step on it, then
  // v = neg + s (pos - neg) rescaled per token to |pos|.
  double true_cfg_scale = 4.0;
  // Text-to-image: prompt embeddings kept (QwenImagePipeline's max_sequence_length, 1..1024).
  int64_t max_sequence_length = 512;
  uint64_t seed = 0;
  // Initial latents: [1, C, h, w], or packed [1, h/2 * w/2, 4C]; drawn from `seed` on the CPU
  // when undefined.
  torch::Tensor latents;
  QwenImageStepCallback on_step;
  DitCacheOptions cache;
};

struct QwenImageTextToImage {
  std::string prompt;
  std::optional<std::string> negative_prompt;  // none: no true CFG
  int width = 1024, height = 1024;             // floored to multiples of 16
  QwenImageSampling sampling;
};

struct QwenImageEdit {
  std::string prompt;
  std::optional<std::string> negative_prompt;
  torch::Tensor image;  // the source, uint8 [H, W, 3]
  // The output size; 0 x 0: the resized source's (~1 MP at its aspect ratio).
  int width = 0, height = 0;
  // With a mask: the edit stays inside it (outside, the source is blended back each step).
  InpaintOptions inpaint;
  QwenImageSampling sampling;
};

struct QwenImageResult {
  torch::Tensor latents;                                // final latents [1, C, h, w] (float32, CPU)
  torch::Tensor image;                                  // [1, H, W, 3] float32 in [0, 1] (CPU)
  torch::Tensor prompt_embeds, negative_prompt_embeds;  // [1, L, hidden] (CPU)
  torch::Tensor input_ids, negative_input_ids;          // what Qwen2.5-VL was fed
  std::array<int64_t, 3> image_grid_thw{};              // edit: the VL processor's grid
  // Edit: the source as resized (uint8 [h, w, 3]) and its packed normalised latents.
  torch::Tensor source_resized, image_latents_packed;
  std::vector<models::QwenImageGrid> img_shapes;
  StageTimings timings;
  std::vector<std::string> warnings;
  bool interrupted = false;
  int steps_run = 0;
  accel::DitCacheStats cache;
};

class QwenImagePipeline {
 public:
  // A Qwen-Image folder on `device`: the transformer and text encoder in `dtype`, the VAE in
  // float32. IoError naming what a folder lacks (an edit model without processor/ included),
  // before any weight loads.
  QwenImagePipeline(const io::ModelFolder& folder, torch::Device device, torch::Dtype dtype,
                    const std::string& transformer_component = "transformer");

  QwenImageResult text_to_image(const QwenImageTextToImage& request);
  QwenImageResult edit(const QwenImageEdit& request);

  // Whether model_index.json names the edit pipeline.
  bool is_edit_model() const { return edit_model_; }
  // calculate_dimensions(1024 * 1024, W / H): the ~1 MP (width, height), multiples of 32, an
  // edit's source is resized to.
  static std::pair<int64_t, int64_t> edit_source_size(int64_t width, int64_t height);

  // A LoRA on the transformer (diffusers / peft names, kohya's lora_unet_* of the same
  // modules, e.g. the Lightning adapters); refused with quantized or streamed weights.
  std::string add_lora(const std::string& path, double scale,
                       const adapters::LoraOptions& options = {});
  void set_scheduler(std::unique_ptr<schedulers::Scheduler> scheduler);
  void set_keep_text_encoders(bool keep) { keep_text_encoder_ = keep; }
  void set_weight_type(const std::string& type);
  void set_weight_streaming(const std::string& mode);
  // What the memory plan may hold (bytes, --max-memory); 0: what the device has free. Each
  // generation plans first (pipeline/memory_plan.h) and refuses to start when nothing fits;
  // streaming "auto" follows the plan.
  void set_max_memory(int64_t bytes) { max_memory_ = bytes; }
  bool streams_weights() const { return transformer_ && transformer_->stream != nullptr; }
  const nn::QuantizedLayers& quantized_layers() const { return quantized_; }
  void check_cache(const DitCacheOptions& cache) const;
  // Ulysses sequence parallelism over `group` (every rank runs the same generation).
  void set_sequence_group(std::shared_ptr<parallel::RankGroup> group);
  // CFG-parallel over a group of two: with true CFG, rank 0 runs the prompt's call and rank 1
  // the negative prompt's, and they trade outputs (each keeps its branch's DiT cache). Every rank
  // runs the same generation. InvalidArgument for another group size.
  void set_cfg_group(std::shared_ptr<parallel::RankGroup> group);

  QwenImageTextEncoder& text_encoder() { return *text_; }
  models::QwenImageTransformer2DModel& transformer();
  models::AutoencoderKLQwenImage& vae() { return vae_; }
  const schedulers::Scheduler& scheduler() const { return *scheduler_; }
  const models::QwenImageTransformerConfig& transformer_config() const { return tconfig_; }
  int64_t vae_scale_factor() const { return vae_->config().spatial_factor(); }
  int64_t size_multiple() const { return 2 * vae_scale_factor(); }

 private:
  void check_sampling(const QwenImageSampling& s) const;
  // Encodes the prompt (and the negative one when true CFG runs) into `out`; returns whether
  // true CFG runs. `image`: the resized source for an edit, else undefined.
  bool encode_prompts(const std::string& prompt, const std::optional<std::string>& negative,
                      const QwenImageSampling& s, const torch::Tensor& image, QwenImageResult& out);
  FolderPlanOptions plan_options() const;
  // The generation's plan: refuses one that does not fit, records its line in `timings`, frees
  // the transformer if the encoder needs its memory.
  void follow_plan(int64_t width, int64_t height, int64_t reference_images, StageTimings& timings);
  torch::Tensor initial_latents(const QwenImageSampling& s, int64_t h, int64_t w) const;
  void prepare_schedule(int steps, int64_t image_tokens);
  // Denoises packed latents of an h x w latent with `source_tokens` (edit: the source's packed
  // latents) appended, the grids in out.img_shapes; returns the unpacked final latents.
  torch::Tensor denoise(const QwenImageSampling& s, torch::Tensor latents, int64_t h, int64_t w,
                        const torch::Tensor& source_tokens, bool true_cfg, QwenImageResult& out,
                        const InpaintLatents* inpaint = nullptr);
  // The source resized to h x w pixels (Lanczos) and encoded to normalised latents [1, C, h/f,
  // w/f] (the posterior's mean).
  torch::Tensor encode_source(const torch::Tensor& image_resized, StageTimings& timings);
  torch::Tensor decode(const torch::Tensor& latents, QwenImageResult& out);

  torch::Device device_;
  torch::Dtype dtype_;
  io::ModelFolder folder_;
  std::string transformer_component_;
  models::QwenImageTransformerConfig tconfig_;
  bool edit_model_ = false;
  bool keep_text_encoder_ = true;
  int64_t max_memory_ = 0;
  std::optional<MemoryPlan> plan_;  // the running generation's
  std::optional<quant::GgmlType> weight_type_;
  std::string weight_streaming_ = "auto";
  nn::QuantizedLayers quantized_;
  std::unique_ptr<QwenImageTextEncoder> text_;
  models::QwenImageTransformer2DModel transformer_{nullptr};
  std::shared_ptr<parallel::RankGroup> sequence_group_, cfg_group_;
  models::AutoencoderKLQwenImage vae_{nullptr};
  std::unique_ptr<schedulers::Scheduler> scheduler_;
  std::unique_ptr<adapters::LoraMerger> lora_;
};

}  // namespace diffuse::pipeline
