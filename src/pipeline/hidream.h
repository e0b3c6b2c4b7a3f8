// HiDream-I1 text-to-image and HiDream-E1 instruction editing (diffusers HiDreamImagePipeline
// and HiDream-ai/HiDream-E1's HiDreamImageEditingPipeline), on the four text encoders, the
// sparse DiT, a flow-matching scheduler and the Flux-style VAE of one model folder.
//
// What the reference does and this reproduces: the model output is NEGATED before guidance;
// I1 guidance batches [uncond, cond]; E1 runs a batch of 3 (uncond, image-cond, full-cond)
// on latents concatenated along the WIDTH with the source image's latents [zeros, image,
// image], keeps the left half, and (clip_cfg_norm) caps the text guidance's per-pixel channel
// norm; I1 rescales the requested size to a fixed area.
#pragma once
#include <torch/types.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "accel/dit_cache.h"
#include "adapters/lora_merger.h"
#include "diffuse/pipeline.h"
#include "io/model_folder.h"
#include "models/autoencoder_kl.h"
#include "models/hidream_transformer.h"
#include "nn/layers.h"
#include "parallel/rank_group.h"
#include "pipeline/denoise_extras.h"
#include "pipeline/hidream_text.h"
#include "pipeline/memory_plan_folder.h"
#include "schedulers/scheduler.h"

namespace diffuse::pipeline {

// Whether `path` is a diffusers folder of a HiDream pipeline (model_index.json's class).
bool is_hidream_folder(const std::string& path);

// One denoising step as it ran (for golden checks and progress).
struct HiDreamStep {
  int index = 0;
  torch::Tensor t;                      // the scheduler's timestep
  torch::Tensor transformer_input;      // the batch the transformer saw
  torch::Tensor transformer_timesteps;  // its timesteps
  torch::Tensor transformer_out;        // RAW output
  torch::Tensor latents;                // after the scheduler step
  torch::Tensor denoised;               // the step's denoised estimate x0 (the preview's)
};
// Returns true to go on, false to cancel (the pipeline throws Cancelled), or
// StepAction::finish_now() to decode the step's denoised estimate at once.
using HiDreamStepCallback = std::function<StepAction(const HiDreamStep&)>;

struct HiDreamSampling {
  int steps = 50;
  double guidance_scale = 5.0;  // <= 1: no guidance (the negative prompt is not encoded)
  // Tokens per text encoder; 0: the folder's (pipeline/hidream_variant.h: 128 for HiDream).
  int64_t max_sequence_length = 0;
  uint64_t seed = 0;
  torch::Tensor latents;  // initial latents [1, C, h, w]; drawn from `seed` when undefined
  // Noise for stochastic schedulers, one per step that draws (else drawn from `seed`).
  std::vector<torch::Tensor> step_noise;
  HiDreamStepCallback on_step;
  VaeTilingOptions vae_tiling;  // the VAE's encode (E1's source) and decode
  // Skip part of the transformer on some steps (accel/dit_cache.h); off: every block runs.
  DitCacheOptions cache;
};

struct HiDreamTextToImage {
  std::string prompt, negative_prompt;
  int width = 1024, height = 1024;  // rescaled to the area of area_side x area_side
  // The pipeline's default_sample_size * vae_scale_factor; 0: the transformer's max_resolution
  // in pixels (1024 for HiDream-I1, whose pipeline hard-codes 128 * 8).
  int area_side = 0;
  HiDreamSampling sampling;
};

struct HiDreamEdit {
  std::string prompt;  // the instruction (E1-Full form: "Editing Instruction: ... Target ...")
  std::string negative_prompt;
  // uint8 [H, W, 3], any size up to 64 MP: scaled to at most the model's area with sides that
  // are multiples of size_multiple() (16 for HiDream; images that already fit are used as
  // they are).
  torch::Tensor image;
  double image_guidance_scale = 4.0;
  bool clip_cfg_norm = true;
  // The last refine_strength of the steps run on HiDream-I1's weights with 2-way guidance on
  // the target description (needs the E1 LoRA: set_editing_lora).
  double refine_strength = 0.0;
  // The target description for the refine phase; empty: the text after "Target Image
  // Description:" in the prompt, else the whole prompt.
  std::string target_prompt;
  // With a mask: the edit stays inside it (outside, the source's latents are blended back after
  // each step, re-noised to the next sigma). crop_padding is for image-to-image and refused.
  InpaintOptions inpaint;
  HiDreamSampling sampling;
};

struct HiDreamResult {
  torch::Tensor latents;  // final latents [1, C, h, w] (float32, CPU)
  torch::Tensor image;    // [1, H, W, 3] float32 in [0, 1] (CPU)
  HiDreamEmbeddings prompt_embeddings, negative_embeddings;
  torch::Tensor image_latents;          // E1: the source image's latents
  HiDreamEmbeddings target_embeddings;  // E1 with refine: the target description's
  // Seconds and memory per stage (text_encode includes loading the text encoders the first
  // time, denoise the transformer's).
  StageTimings timings;
  std::vector<std::string> warnings;  // what the user should know that did not stop the run
  // The step callback asked to finish early: the image is the denoised estimate after
  // `steps_run` steps.
  bool interrupted = false;
  int steps_run = 0;
  // With HiDreamSampling::cache: what the cache skipped.
  accel::DitCacheStats cache;
};

// Where the stages other than the transformer run; unset = the transformer's device (and
// dtype for the text encoders). E.g. the 16 GiB Llama on another chip or on the host while
// the transformer has the accelerator to itself.
struct HiDreamPlacement {
  std::optional<torch::Device> text_device;
  std::optional<torch::Dtype> text_dtype;
  std::optional<torch::Device> vae_device;
};

// The placement from device flags ("" = the transformer's device) and the --dtype flag
// ("auto" picks per device, as for the transformer). DeviceError/InvalidArgument as
// resolve_device/resolve_dtype give them.
HiDreamPlacement hidream_placement(const std::string& text_encoder_device,
                                   const std::string& vae_device, const std::string& dtype);

class HiDreamPipeline {
 public:
  // A HiDream model folder on `device` (transformer and text encoders in `dtype`, the VAE in
  // float32 as its config's force_upcast asks), the text encoders and the VAE where
  // `placement` puts them. The VAE loads now; the text encoders and the transformer when
  // first needed, so that with keep_text_encoders off the peak is the larger of the two, not
  // their sum (Llama-8B + T5-XXL alone are 23 GiB in bf16).
  HiDreamPipeline(const io::ModelFolder& folder, torch::Device device, torch::Dtype dtype,
                  const std::string& transformer_component = "transformer",
                  const HiDreamPlacement& placement = {});

  // (width, height) after the I1 pipeline's area normalisation to area_side^2.
  std::pair<int, int> normalized_size(int width, int height, int area_side) const;
  // (width, height) an edit's W x H source is scaled to; InvalidArgument when a side would be
  // under size_multiple().
  std::pair<int64_t, int64_t> edit_size(int64_t width, int64_t height) const;

  HiDreamResult text_to_image(const HiDreamTextToImage& request);
  HiDreamResult edit(const HiDreamEdit& request);

  // HiDream-E1-Full: the editing weights are this pipeline's (I1) transformer plus a peft LoRA
  // file (low-rank pairs and full tensors), merged now; the refine phase switches the low-rank
  // updates off for its steps (peft's disable_adapters: the full tensors stay) and on again
  // afterwards. FormatError/IoError naming the key or file; the weights are unchanged on error.
  void set_editing_lora(const std::string& path, const adapters::LoraOptions& options = {});
  void apply_editing_lora();  // (re)enables it after a refine phase
  // A LoRA on the transformer (peft, diffusers or kohya key names; a file that changes none of
  // its weights is refused), merged at `scale`; returns what it changed, for the user to read.
  // E1-Full's refine phase switches it off with the editing LoRA, as peft's
  // disable_adapters() does. Errors as set_editing_lora.
  std::string add_lora(const std::string& path, double scale,
                       const adapters::LoraOptions& options = {});

  // Replaces the scheduler (default: the folder's scheduler/scheduler_config.json).
  void set_scheduler(std::unique_ptr<schedulers::Scheduler> scheduler);
  // Whether the text encoders stay loaded after a prompt is encoded (default: yes; the CLI,
  // which encodes once, frees them before the transformer loads).
  void set_keep_text_encoders(bool keep) { keep_text_encoders_ = keep; }
  // Transformer weight streaming (models/block_streaming.h), chosen before it loads: "on",
  // "off", or "auto" (default): as the generation's memory plan decides (streamed when the
  // transformer does not fit resident), so that 17B runs on a 24 GiB machine.
  void set_weight_streaming(const std::string& mode);
  // Whether the loaded transformer streams its blocks.
  bool streams_weights() const { return transformer_ && transformer_->stream != nullptr; }
  // The transformer's linear weights kept in ggml blocks ("q8_0", "q4_0"; "none": plain), chosen
  // before it loads: each is quantized right after loading (the load itself still peaks at the
  // plain model) and dequantized per call into the compute dtype. Streaming is then off (the
  // point is a model that fits), and LoRAs are refused (they merge into plain weights).
  void set_weight_type(const std::string& type);
  // What the memory plan may hold (pipeline/memory_plan.h): bytes, as --max-memory sets it for
  // a smaller card than the one present; 0 (default) plans against what the device has free.
  void set_max_memory(int64_t bytes) { max_memory_ = bytes; }
  // The plan of a width x height generation (with `reference_images` source images beside it),
  // from the folder's configs and this pipeline's settings; nothing loads. Each generation
  // makes one first, refuses to start when it does not fit, and follows it: the text encoders
  // one at a time when the four do not fit together, the transformer streamed ("auto") when it
  // does not fit resident, the transformer freed before the encoders when both do not fit.
  MemoryPlan plan(int64_t width, int64_t height, int64_t reference_images,
                  const VaeTilingOptions& vae_tiling = {}) const;
  // What set_weight_type's quantization kept: layers, bytes before and after.
  const nn::QuantizedLayers& quantized_layers() const { return quantized_; }
  HiDreamTextEncoders& text_encoders();
  models::HiDreamImageTransformer2DModel& transformer();
  models::AutoencoderKL& vae() { return vae_; }
  // Where each stage runs (the placement given, else the transformer's device and dtype).
  const torch::Device& text_device() const { return text_device_; }
  const torch::Device& vae_device() const { return vae_device_; }
  torch::Dtype text_dtype() const { return text_dtype_; }
  const schedulers::Scheduler& scheduler() const { return *scheduler_; }
  // The side of the square whose area text-to-image renders (the transformer's max_resolution
  // in pixels, 1024 for HiDream-I1).
  int area_side() const;
  // Pixels per latent pixel: 2 ** (len(vae.block_out_channels) - 1) from the VAE's config, as
  // diffusers' vae_scale_factor (8 for the Flux VAE HiDream ships).
  int64_t vae_scale_factor() const;
  // What image sides must be multiples of: the VAE factor times the transformer's patch size.
  int64_t size_multiple() const { return vae_scale_factor() * tconfig_.patch_size; }

  // Ulysses sequence parallelism (parallel/ulysses.h): every rank of `group` runs the same
  // generation (same inputs and seed) and each transformer call splits its image tokens over
  // them; after every step the ranks check that their latents are identical. Null: one device.
  void set_sequence_group(std::shared_ptr<parallel::RankGroup> group);
  // CFG-parallel: each rank of `group` runs the transformer on its share of the guidance
  // branches (I1's two, E1's three; branch_split.h) and the ranks all-gather the predictions,
  // so guidance and scheduler steps are replicated. With a sequence group too, each branch
  // share is split by tokens over that group (cfg,ulysses). A batch with fewer branches than
  // ranks (no guidance, E1's two-branch refine phase with three ranks) runs whole on every
  // rank. Null: one device.
  void set_cfg_group(std::shared_ptr<parallel::RankGroup> group) { cfg_group_ = std::move(group); }
  // InvalidArgument for a cache this model cannot run (a block range outside its blocks).
  void check_cache(const DitCacheOptions& cache) const;

 private:
  torch::Tensor initial_latents(const HiDreamSampling& s, int64_t h, int64_t w) const;
  void prepare_schedule(int steps);
  // The guided velocity for latents x at timestep t; records its transformer call in `step`.
  using Velocity = std::function<torch::Tensor(const torch::Tensor& x, const torch::Tensor& t,
                                               HiDreamStep& step)>;
  // The NEGATED transformer output for `input` (the pipelines' velocity), recorded in `step`.
  torch::Tensor run_transformer(const torch::Tensor& input, const torch::Tensor& t,
                                const HiDreamEmbeddings& text,
                                const models::HiDreamForwardOptions& fwd, HiDreamStep& step);
  // Records timings, steps_run and (after a finish_now()) interrupted and its warning in `out`.
  torch::Tensor denoise(const HiDreamSampling& s, torch::Tensor latents, const Velocity& velocity,
                        HiDreamResult& out, const InpaintLatents* inpaint = nullptr);
  // Sets out.image, its timings and memory, and a warning if the VAE had to tile.
  void decode(const torch::Tensor& latents, const VaeTilingOptions& tiling, HiDreamResult& out);
  // NumericalError if the text encoders' outputs went NaN/Inf.
  void check_text_stage(const HiDreamEmbeddings& e) const;
  // Each prompt through the four encoders (a batch of one each), checked where they ran, on the
  // transformer's device.
  std::vector<HiDreamEmbeddings> encode_prompts(const std::vector<std::string>& prompts,
                                                int64_t max_sequence_length);
  FolderPlanOptions plan_options() const;
  // Makes the generation's plan (plan()), refuses one that does not fit, records its line in
  // `timings`, and frees the transformer if the plan says the encoders need its memory.
  void follow_plan(int64_t width, int64_t height, int64_t reference_images,
                   const VaeTilingOptions& vae_tiling, StageTimings& timings);
  // Ends the text stage that began at `start`: frees the encoders if asked, records the stage.
  void end_text_stage(double start, StageTimings& timings);
  // The source image as the VAE takes it ([1, 3, h, w] in [-1, 1]), resized if needed.
  torch::Tensor edit_source_pixels(const torch::Tensor& image) const;
  static std::string target_description(const HiDreamEdit& r);

  torch::Device device_;
  torch::Dtype dtype_;
  torch::Device text_device_, vae_device_;
  torch::Dtype text_dtype_;
  io::ModelFolder folder_;
  std::string transformer_component_;
  models::HiDreamTransformerConfig tconfig_;
  int64_t max_sequence_length_ = 128;  // the folder's
  int64_t sequence_length(const HiDreamSampling& s) const {
    return s.max_sequence_length > 0 ? s.max_sequence_length : max_sequence_length_;
  }
  bool keep_text_encoders_ = true;
  int64_t max_memory_ = 0;
  std::optional<MemoryPlan> plan_;  // the running generation's
  std::string weight_streaming_ = "auto";
  std::optional<quant::GgmlType> weight_type_;  // set_weight_type; none: plain weights
  nn::QuantizedLayers quantized_;
  std::unique_ptr<HiDreamTextEncoders> text_;
  std::unique_ptr<accel::DitCache> cache_;  // the running generation's, if it caches
  std::shared_ptr<parallel::RankGroup> sequence_group_, cfg_group_;
  models::HiDreamImageTransformer2DModel transformer_{nullptr};
  models::AutoencoderKL vae_{nullptr};
  std::unique_ptr<schedulers::Scheduler> scheduler_;
  // The transformer's adapters: the E1 editing LoRA and the user's (add_lora).
  adapters::LoraMerger& lora_merger(const char* what);
  std::unique_ptr<adapters::LoraMerger> lora_;
  std::shared_ptr<adapters::LoraAdapter> editing_adapter_;
  int editing_lora_id_ = -1;
};

}  // namespace diffuse::pipeline
