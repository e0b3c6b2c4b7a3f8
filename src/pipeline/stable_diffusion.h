// The Stable Diffusion engine behind Text2Image and Image2Image: owns the components and
// runs the stages (encode prompt, prepare latents, denoise with CFG, decode / encode images).
#pragma once
#include <ATen/core/Generator.h>
#include <torch/nn/module.h>
#include <torch/types.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "diffuse/pipeline.h"
#include "models/vae_tiling.h"
#include "pipeline/vae_tiling_policy.h"

namespace diffuse::schedulers {
class Scheduler;
}
namespace diffuse::accel {
struct TokenMergingPayoff;
}
namespace diffuse::parallel {
class RankGroup;
}

namespace diffuse::pipeline {

struct ModelSource;
struct DenoiseExtras;
struct FolderPlanOptions;
class ControlNetSteps;

// Receives named intermediate tensors (golden tests: "step.3.latents", ...).
using TraceFn = std::function<void(const std::string&, const torch::Tensor&)>;
// Supplies every random tensor the pipeline draws (VAE posterior sample, img2img noise,
// ancestral step noise), in order, instead of the seeded CPU generator. Used to replay a
// reference run whose noise was recorded.
using NoiseFn = std::function<torch::Tensor(c10::IntArrayRef shape)>;

struct PromptEmbeddings {
  torch::Tensor positive;  // [N, T, D] (already repeated per image)
  torch::Tensor negative;  // undefined when guidance is off
  // SDXL: the pooled, projected embedding of the last text encoder [N, P] (the UNet's
  // text_embeds); undefined for SD 1.x/2.x.
  torch::Tensor pooled, negative_pooled;
  std::vector<bool> truncated;  // per prompt / negative prompt given
  std::vector<std::string> warnings;
};

class StableDiffusion {
 public:
  StableDiffusion(const std::string& path, const LoadOptions& options);
  ~StableDiffusion();

  const PipelineInfo& info() const { return info_; }
  void set_trace(TraceFn trace) { trace_ = std::move(trace); }
  void set_noise_source(NoiseFn noise) { noise_ = std::move(noise); }
  // Replaces the pipeline's scheduler config (diffusers scheduler_config.json content).
  void set_scheduler_config(const nlohmann::json& config);
  // CFG-parallel: with a group set, each generation computes only this rank's guidance
  // branch(es) and all-gathers the noise predictions every step (generations need guidance
  // on); only rank 0 decodes, other ranks return the final latents without images. Every rank's
  // step callback must answer alike (the server's ranks agree on each step: server/rank_jobs.h).
  void set_cfg_group(std::shared_ptr<parallel::RankGroup> group) { cfg_group_ = std::move(group); }

  GenerationResult text2image(const GenerationConfig& config, const StepCallback& on_step);
  // init: [B, 3, H, W] float in [0, 1] (B = 1 or one per prompt).
  GenerationResult image2image(const GenerationConfig& config, const torch::Tensor& init,
                               const StepCallback& on_step);

  // Stages, public for tools and tests.
  PromptEmbeddings encode_prompt(const std::vector<std::string>& prompts,
                                 const std::vector<std::string>& negative_prompts,
                                 int images_per_prompt, bool guidance,
                                 const std::string& prompt_syntax = "plain");
  // The "a1111" syntax: chunks of 75 tokens, weights; nullopt when every text is one chunk
  // whose weights are all 1 (written "(fox:1.0)" or none at all): then `plain` holds the texts
  // with the syntax taken out, which the plain path encodes exactly as A1111 does.
  struct PlainPrompts {
    std::vector<std::string> prompts, negative_prompts, warnings;
  };
  std::optional<PromptEmbeddings> encode_weighted_prompts(
      const std::vector<std::string>& prompts, const std::vector<std::string>& negative_prompts,
      int images_per_prompt, bool guidance, PlainPrompts* plain = nullptr);
  // -> [N, H, W, 3] float in [0,1], CPU; in tiles when `tiling` is set.
  torch::Tensor decode_latents(const torch::Tensor& latents,
                               const std::optional<models::VaeTiling>& tiling = std::nullopt);
  // GenerationConfig::vae_tiling resolved for `images` images of height x width pixels.
  VaeTilingChoice vae_tiling_for(const GenerationConfig& config, int64_t images, int64_t height,
                                 int64_t width) const;
  int vae_scale_factor() const;
  // The memory plan of a generation of this size (pipeline/memory_plan.h), its line into
  // `timings`: InvalidArgument with the plan's advice when it cannot fit the device's memory
  // (or --max-memory), before anything of it runs.
  void plan_memory_for(const GenerationConfig& config, int width, int height,
                       StageTimings* timings) const;
  // The plan's options of this pipeline: its devices, dtypes, --weights and residency.
  FolderPlanOptions plan_options() const;
  int64_t latent_channels() const;
  // The text encoders, UNet and VAE as loaded now, by component name (tools and tests; a
  // network that offload has freed is left out).
  std::vector<std::pair<std::string, torch::nn::Module*>> loaded_networks() const;

 private:
  struct Components;
  std::unique_ptr<Components> c_;
  PipelineInfo info_;
  TraceFn trace_;
  NoiseFn noise_;
  std::shared_ptr<parallel::RankGroup> cfg_group_;

  torch::Tensor draw_noise(c10::IntArrayRef shape, at::Generator& gen) const;
  // ConfigError when a tokenizer has ids outside its encoder's vocabulary, or when the
  // encoders' widths do not add up to the UNet's cross_attention_dim.
  void check_text_encoders(const ModelSource& source) const;
  // Makes LoadOptions::loras plus `for_this_run` the adapters in effect (new files read and
  // checked against the text encoder and UNet first; nothing changes on an error). Returns
  // the seconds it took.
  double apply_loras(const std::vector<LoraSpec>& for_this_run);
  // The run's scheduler (the model's, or the one named in the config) with its timesteps set.
  std::unique_ptr<schedulers::Scheduler> make_scheduler(const GenerationConfig& config) const;
  void seed_devices(uint64_t seed) const;
  // The intra-op threads for a generation of `images` images of width x height (its UNet's
  // step work, device::threads_for_step_work); the count in effect when the UNet is not on
  // the CPU.
  int cpu_threads_for(const GenerationConfig& config, int64_t images, int width, int height) const;
  // Token merging's measured payoff at this run shape (UNet batch, latent size), measured once
  // per shape for the loaded model and kept there (the whole call's time is filled in by the
  // first run that times one); under CFG-parallel the ranks' times are summed, so every rank
  // decides alike.
  accel::TokenMergingPayoff& token_merging_payoff(const TokenMergingOptions& tome, int64_t batch,
                                                  int64_t latent_height, int64_t latent_width);
  // The start every run shares: seed the devices, encode the prompts (negative ones too when
  // guidance is on), time it and record the text encoder's memory.
  PromptEmbeddings encode_for_run(const GenerationConfig& config, uint64_t seed, double t0,
                                  StageTimings* timings);

  void trace(const std::string& name, const torch::Tensor& t) const {
    if (trace_) trace_(name, t);
  }
  // `extras`: inpainting latents and ControlNets (pipeline/denoise_extras.h), or none.
  GenerationResult denoise_and_decode(const GenerationConfig& config,
                                      const PromptEmbeddings& embeds, torch::Tensor latents,
                                      const torch::Tensor& timesteps,
                                      schedulers::Scheduler& scheduler, at::Generator& gen,
                                      const StepCallback& on_step, StageTimings timings,
                                      uint64_t seed, const DenoiseExtras* extras = nullptr);
  // image2image with config.inpaint.mask: StableDiffusionInpaintPipeline's stages. `init` is
  // the source at its own size ([1, 3, H, W] in [0, 1]); it is resized or cropped here.
  GenerationResult inpaint(const GenerationConfig& config, const torch::Tensor& init,
                           const StepCallback& on_step);
  // The generation's ControlNets (loaded once per folder, checked against the UNet), their
  // control images at height x width; null without any.
  std::unique_ptr<ControlNetSteps> controlnet_steps(const GenerationConfig& config, int64_t height,
                                                    int64_t width);
  // The VAE's posterior sample of images in [-1, 1] ([1, 3, H, W]), as latents repeated to
  // `batch` (the noise drawn from `gen` or the noise source).
  torch::Tensor encode_image_latents(const torch::Tensor& image, int64_t batch,
                                     const GenerationConfig& config, at::Generator& gen,
                                     const std::string& trace_prefix);
  // The first index of the schedule an image-to-image run of config.strength runs from
  // (diffusers' get_timesteps).
  static int64_t strength_begin(const GenerationConfig& config, int64_t order);
};

// [N, H, W, 3] float in [0, 1] -> 8-bit images, rounded as diffusers' numpy_to_pil does.
std::vector<Image> to_images(const torch::Tensor& nhwc);
// An RGB image as a uint8 [H, W, 3] tensor (a copy), as the editing pipelines take it.
torch::Tensor image_to_tensor(const Image& image);

// Validates what every generate() call needs; throws InvalidArgument naming the field. Sizes
// must be multiples of `size_multiple`: the model's VAE scale factor (1 where it is not known
// yet, or where the size is only an aspect ratio).
void validate_generation_config(const GenerationConfig& config, bool image2image,
                                int size_multiple = 1);

}  // namespace diffuse::pipeline
