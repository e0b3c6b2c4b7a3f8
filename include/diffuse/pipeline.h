// The public API: Stable Diffusion text-to-image and image-to-image pipelines, loaded from a
// diffusers folder or a single-file checkpoint, placed on a device by policy.
//
//   auto pipe = diffuse::Text2Image::load("models/sd21", {});
//   diffuse::GenerationConfig cfg;
//   cfg.prompts = {"a photograph of an astronaut riding a horse"};
//   cfg.seed = 42;
//   auto result = pipe.generate(cfg);
//   diffuse::write_png("out.png", result.images[0]);
#pragma once
#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "diffuse/errors.h"
#include "diffuse/image.h"
#include "diffuse/timings.h"

namespace diffuse {

// A LoRA adapter file (peft / diffusers or kohya / A1111 .safetensors) and its strength;
// negative scales subtract it.
struct LoraSpec {
  std::string path;
  double scale = 1.0;
};

struct LoadOptions {
  std::string device = "auto";  // auto|cpu|cuda[:N]|npu[:N]; auto honours DIFFUSE_DEVICE
  // Per-component placement (like OpenVINO's compile(text_encoder, denoiser, vae devices)):
  // empty = the same device as the UNet. Tensors move between stages automatically.
  std::string text_encoder_device;
  std::string vae_device;
  std::string dtype = "auto";      // auto|fp32|bf16|fp16 for text encoder and UNet
  std::string vae_dtype = "auto";  // the VAE separately (auto keeps it fp32 where needed)
  std::string attention = "auto";  // auto|math|sdpa|flash|npu (env DIFFUSE_ATTENTION)
  // Single-file checkpoints: a diffusers folder whose config.json files and tokenizer to use
  // (required for non-standard shapes; the tokenizer comes from here or a sibling folder).
  std::string config_dir;
  // Single-file checkpoints: force v-prediction (SD2.x 768-v) or epsilon; unset = infer.
  std::optional<bool> v_prediction;
  // Each network is in memory only while its stage runs (text encoder, UNet, VAE), its
  // weights copied again from the memory-mapped model file when next needed: the peak is
  // the UNet's instead of all three together (SD2.1 bf16 on CPU: ~2.0 GiB instead of ~2.9),
  // for about a second more per generation. Images are bit-identical either way.
  bool offload = false;
  // The caller generates once and exits (the CLI's run without --batch-count): each network is
  // loaded when its stage starts and freed when it ends, as with offload, so that a finished
  // stage's network does not sit beside the next one's (SD2.1-base 512x512 bf16 on the CPU:
  // peak 3.4 -> 2.3 GiB), in the same time (each network loads once either way) and with the
  // default's speed options (packed convolution weights). A later generation loads them again.
  bool single_generation = false;
  // Float32 on the CPU with a 16-bit model file (SD checkpoints are usually float16): the
  // weights of the networks' linear and convolution layers stay in the file's dtype and are
  // widened per call. Images are bit-identical (widening is exact); the resident weights are
  // nearly halved (SD2.1-base: 4.8 -> 2.5 GiB), for 0-3 % more time per step. false: widen
  // them all at load.
  bool keep_16bit_weights = true;
  // bf16 UNet on the CPU: its convolutions below 32x32 latent pixels (SD's two lowest levels
  // at 512x512) also keep their weights in oneDNN's blocked layout, made at the first step,
  // instead of oneDNN reordering them at every call: SD2.1-base 512x512 steps ~4 % faster for
  // ~0.9 GiB more memory. Ignored with offload, whose point is the lowest peak.
  bool pack_conv_weights = true;
  // LoRA adapters merged into the UNet and text encoder weights after loading (no run-time
  // cost), in float32, then cast to the network's dtype. A tensor that matches no weight is an
  // error unless lora_lenient (then PipelineInfo::loras reports what was skipped).
  std::vector<LoraSpec> loras;
  bool lora_lenient = false;
  // "merged": adapters written into the weights (no run-time cost; changing them re-patches
  // the touched weights). "unmerged": each adapter's low-rank product is added to its layer's
  // output at run time (switching adapters costs nothing; every step pays the products).
  std::string lora_mode = "merged";
  // The UNet's and the VAE's linear and convolution weights kept quantized in memory: "none",
  // "q8_0" (~53 % of bf16's bytes), "q4_0" (~28 %) or "int8" (rows of int8 codes and a scale),
  // quantized as they load and dequantized per layer as it runs (int8 multiplies in integers
  // where the CPU has VNNI and no AMX). The text encoders stay plain. LoRAs then run unmerged
  // (there is no plain weight to merge into).
  std::string weights = "none";
  // What a generation may hold in memory (bytes, --max-memory; 0: what the device has free):
  // a generation whose activations need more is refused before it starts.
  int64_t max_memory = 0;
  // The UNet from a file of its own instead of the model's (city96's GGUFs, a UNet saved by
  // ComfyUI): safetensors or GGUF, in diffusers names or the original LDM names (with or
  // without "model.diffusion_model."). The model's unet config must describe it; a GGUF's
  // quantized matrices stay quantized (LoRAs then run unmerged).
  std::string unet_file;
};

// DeepCache (arXiv 2312.00858): the UNet's deep features change little between neighbouring
// steps, so only every few steps run the whole network ("full" steps) and keep the feature
// that the chosen up block receives from below; the steps between run only the shallow
// branch (down path to the chosen block, then the matching up path) on that cached feature.
struct DeepCacheOptions {
  int interval = 1;  // cache_interval: a full step every `interval` steps; 1 = off
  // cache_layer_id / cache_block_id: the down block and its resnet(/attention) pair whose skip
  // connection the shallow branch still computes (block id = number of pairs: its downsampler).
  int layer_id = 0;
  int block_id = 0;
  // Full steps denser early (the paper's non-uniform schedule), the same number of them.
  bool non_uniform = false;
};

// Token Merging for SD (Bolya & Hoffman 2023): on selected self-attentions, the `ratio` of
// tokens most similar to a destination token (one random position per 2x2 cell, drawn from
// the run's seed) are averaged into it before the attention and copied back after.
struct TokenMergingOptions {
  double ratio = 0;  // in [0, 1); 0 = off
  // Transformer2DModel names ("down_blocks.0.attentions.1"). Empty = the usual choice: the first
  // two of the first down block with attention and the last two of the last up block with it.
  std::vector<std::string> layers;
  // false ("auto"): before the run, the sites' self-attentions are timed plain and merged at the
  // run's size on its device (once per size for a loaded model); where merging does not make
  // them faster it is left out and the result says so in a warning (an acceleration never
  // makes a run slower). true ("always"): merge without measuring.
  bool always = false;
};

// Training-free caches for DiT denoisers (HiDream; designed for every DiT): on some steps part
// of the transformer is not run and what it would add is reused or forecast from full steps.
// Off by default (bit-identical to running without it).
struct DitCacheOptions {
  enum class Method {
    kOff,
    // First-Block Cache: run the first block; when its residual on the image tokens changed by
    // less than `threshold` (relative mean absolute difference) since the last full step, reuse
    // that step's residual of all the other blocks.
    kFirstBlock,
    // TaylorSeer: a full step every `interval` steps; the steps between forecast the final
    // image features by a Taylor expansion of order `order` (0: plain reuse) from finite
    // differences of the last full steps.
    kTaylorSeer,
    // A static block schedule (MindIE-SD's DiTCache): blocks [first_block, last_block] run on
    // every `interval`-th step; the steps between add their residual of the last run instead.
    kBlockSchedule,
  };
  Method method = Method::kOff;
  double threshold = 0.1;  // kFirstBlock, in [0, 1]; 0 reuses nothing
  int interval = 3;        // kTaylorSeer, kBlockSchedule: in [1, 100]; 1 computes every step
  int order = 1;           // kTaylorSeer: 0, 1 or 2
  // kBlockSchedule: indices over all blocks, dual-stream first (HiDream: 0..15 dual, 16..47
  // single); the range lies within one kind. -1: the middle half of the single-stream blocks
  // (of the dual-stream ones in a model without single-stream blocks).
  int first_block = -1, last_block = -1;
  int warmup = 2;  // the first steps always run in full (the layout forms there)
};

// The VAE in overlapping tiles blended at their seams (diffusers' enable_vae_tiling), so that
// large images fit in memory: the VAE then holds one tile's activations, not the image's.
// Tiles give slightly different pixels than the whole image (GroupNorm sees one tile), so
// "auto" tiles only where it pays.
struct VaeTilingOptions {
  // "auto": tiles above 1024x1024 pixels, or when the untiled pass would not fit in the
  // memory available (a warning says so); "on": whenever the image is larger than one tile;
  // "off": never.
  std::string mode = "auto";
  int tile_size = 0;      // pixels per tile side; 0 = the VAE config's sample_size (else 512)
  double overlap = 0.25;  // fraction of a tile shared with its neighbour, in [0, 0.5]
};

// Stable Diffusion XL's micro-conditioning (the UNet's time ids); models without it ignore it.
// Sizes in pixels; 0 = the generated image's own size, as diffusers' defaults.
struct SizeConditioning {
  int original_width = 0, original_height = 0;
  int crop_top = 0, crop_left = 0;
  int target_width = 0, target_height = 0;
  // Refiner-style models (model_index.json requires_aesthetics_score): the scores the positive
  // and the negative branch are conditioned on.
  double aesthetic_score = 6.0;
  double negative_aesthetic_score = 2.5;
};

// Inpainting: repaint part of the init image (image-to-image with a mask).
struct InpaintOptions {
  // uint8 [H, W] (grey) or [H, W, 3|4] (RGB(A): its colour, not its alpha), any size (resized
  // to the generation's as diffusers does): white = repaint, black = keep, grey = partly (the
  // latents see it binarised at 0.5; the pasted-back overlay of `crop_padding` blends by it).
  // Undefined = no mask (plain image-to-image).
  torch::Tensor mask;
  double blur = 0;      // Gaussian blur of the mask (sigma, pixels), after `invert`
  bool invert = false;  // repaint the black part instead of the white one
  // >= 0: "inpaint only masked" (diffusers' padding_mask_crop, A1111's inpaint_full_res): work
  // at the generation's size on the box around the mask widened by this many pixels, and paste
  // the result back over the untouched source. -1 = off.
  int crop_padding = -1;
  // What the masked region starts from when strength < 1 (A1111's inpainting_fill):
  // "original" (the source, as diffusers), "fill" (the source with the masked region filled
  // from its surroundings, OpenCV's Telea inpainting), "latent_noise" (pure noise there),
  // "latent_nothing" (zero latents there).
  std::string fill = "original";
};

// One ControlNet of a generation (several run together, their residuals summed).
struct ControlNetUnit {
  std::string model;    // a diffusers ControlNet folder
  torch::Tensor image;  // the control image: uint8 [H, W, 3], any size (resized as diffusers)
  double scale = 1.0;   // controlnet_conditioning_scale
  double start = 0.0;   // control_guidance_start / _end: the fraction of the steps it acts on
  double end = 1.0;
  // A preprocessor run on the image first: "" (none), "canny" or "canny:LOW:HIGH" (OpenCV's
  // Canny edges, 100/200 by default), so that an ordinary photo can steer a canny ControlNet.
  std::string preprocess;
};

struct GenerationConfig {
  std::vector<std::string> prompts;           // one image batch entry per prompt
  std::vector<std::string> negative_prompts;  // empty, one for all, or one per prompt
  int width = 0;                              // 0 = the model's default size
  int height = 0;
  int steps = 25;
  double guidance_scale = 7.5;   // <= 1 disables classifier-free guidance
  double strength = 0.8;         // img2img: how much of the schedule to run, in (0, 1]
  std::optional<uint64_t> seed;  // unset = random; the result reports the seed used
  int images_per_prompt = 1;
  std::string scheduler;  // ddim|pndm|euler|euler_a|dpmpp_2m|lms; "" = the model's own
  double eta = 0.0;       // DDIM only
  // "plain": the prompt as diffusers reads it (truncated at 77 tokens; exact parity).
  // "a1111": AUTOMATIC1111's syntax: (word:1.3) / (word) / [word] weights, BREAK, and prompts
  // of any length in chunks of 75 tokens (the CLI's and the server's default).
  std::string prompt_syntax = "plain";
  // Advanced: start from these latents ([N, C, h, w], before init_noise_sigma scaling) instead
  // of seeded noise (txt2img), or use this noise for add_noise (img2img).
  torch::Tensor latents;
  torch::Tensor noise;
  // UNet accelerators; both off by default (bit-identical to running without them).
  DeepCacheOptions deep_cache;
  TokenMergingOptions token_merging;
  // SDXL's ensemble of expert denoisers (base -> refiner), as diffusers' denoising_end /
  // denoising_start: the fraction of the schedule at which this run stops or starts, cut where
  // the timesteps pass round(T * (1 - fraction)) (T = num_train_timesteps). denoising_end < 1:
  // stop there and return the latents undecoded (GenerationResult::latents, no images).
  // denoising_start > 0 (image-to-image only): continue another run from its latents, given as
  // `latents` (no init image, no noise added); strength is then unused.
  double denoising_start = 0.0;
  double denoising_end = 1.0;
  // Graph replay of the UNet call (UNet models on a CUDA device: CUDA graphs; on an Ascend
  // npu: torch_npu's NPUGraph): recorded at the first step, replayed after; bit-identical to
  // the eager call, with less host work per step. (Named for CUDA, where it came first.)
  bool cuda_graph = false;
  // DiT models (HiDream): refused by UNet models.
  DitCacheOptions dit_cache;
  VaeTilingOptions vae_tiling;
  SizeConditioning size_conditioning;
  // LoRA adapters for this generation, on top of LoadOptions::loras. Between generations
  // only the weights of adapters that changed are patched again, from kept originals: a model
  // whose adapters are all removed again is bit-identical to the one loaded (hot swap).
  std::vector<LoraSpec> loras;
  // Image-to-image only: repaint where the mask says (UNet models: 9-channel inpainting UNets
  // and ordinary ones, by blending the kept region back each step).
  InpaintOptions inpaint;
  // UNet models: ControlNets steering the layout; guess_mode as diffusers' (the ControlNets
  // see the conditional branch only, their residuals scaled from 0.1 to 1 by depth).
  std::vector<ControlNetUnit> controlnets;
  bool guess_mode = false;
};

struct StepEvent {
  int step = 0;  // 0-based
  int num_steps = 0;
  double timestep = 0;
  double elapsed_s = 0;                    // since the denoising loop started
  const torch::Tensor* latents = nullptr;  // x_t after this step
  // What this step predicts the finished latents to be (the denoised estimate x0, in the same
  // latent space): what a preview should show, and what finish_now() decodes.
  const torch::Tensor* denoised = nullptr;
};

// What a step callback asks for: go on (true), cancel (false: generate() throws
// diffuse::Cancelled), or finish_now(): stop denoising and decode the last step's denoised
// estimate, as AUTOMATIC1111's interrupt does (the result says so in `interrupted`).
class StepAction {
 public:
  StepAction(bool go_on) : kind_(go_on ? Kind::kContinue : Kind::kCancel) {}  // NOLINT
  static StepAction finish_now() { return StepAction(Kind::kFinish); }
  bool go_on() const { return kind_ == Kind::kContinue; }
  bool cancel() const { return kind_ == Kind::kCancel; }
  bool finish() const { return kind_ == Kind::kFinish; }

 private:
  enum class Kind { kContinue, kCancel, kFinish };
  explicit StepAction(Kind kind) : kind_(kind) {}
  Kind kind_;
};
using StepCallback = std::function<StepAction(const StepEvent&)>;

struct GenerationResult {
  std::vector<Image> images;
  torch::Tensor images_float;  // [N, H, W, 3] float32 in [0, 1] on the CPU
  torch::Tensor latents;       // final latents [N, C, h, w] float32 on the CPU
  uint64_t seed = 0;
  StageTimings timings;
  // Things the user should know but that did not stop the run (e.g. a prompt longer than the
  // text encoder's 77 tokens was truncated, as the reference pipeline does).
  std::vector<std::string> warnings;
  // The step callback asked to finish early (StepAction::finish_now): the images are the
  // denoised estimate after `steps_run` steps.
  bool interrupted = false;
  int steps_run = 0;
};

struct PipelineInfo {
  std::string model;   // path it was loaded from
  std::string device;  // where the UNet runs
  std::string text_encoder_device, vae_device;
  std::string unet_dtype, text_encoder_dtype, vae_dtype;
  std::string attention;
  std::string scheduler;  // default scheduler class
  std::string prediction_type;
  int default_width = 0, default_height = 0;
  // Networks live only while their stage runs (LoadOptions::offload or single_generation).
  bool offload = false;
  // Bytes of the resident networks' parameters (0 with offload: nothing stays resident).
  int64_t weight_bytes = 0;
  std::string weights = "none";  // LoadOptions::weights
  double load_s = 0;
  // One line per LoRA adapter: path, scale, weights it changes per network, and warnings.
  std::vector<std::string> loras;
};

namespace pipeline {
class StableDiffusion;
}

class Text2Image {
 public:
  // `path` is a diffusers folder (model_index.json) or a single-file .safetensors checkpoint.
  static Text2Image load(const std::string& path, const LoadOptions& options = {});
  GenerationResult generate(const GenerationConfig& config, const StepCallback& on_step = {});
  const PipelineInfo& info() const;
  std::shared_ptr<pipeline::StableDiffusion> impl() const { return impl_; }

 private:
  std::shared_ptr<pipeline::StableDiffusion> impl_;
};

class Image2Image {
 public:
  static Image2Image load(const std::string& path, const LoadOptions& options = {});
  // Image-to-image on a model already loaded for text-to-image (no second copy in memory).
  static Image2Image sharing(const Text2Image& loaded);
  // The init image is resized to width x height when those are set, else to its own size
  // rounded down to a multiple of 8.
  GenerationResult generate(const GenerationConfig& config, const Image& init_image,
                            const StepCallback& on_step = {});
  const PipelineInfo& info() const;
  std::shared_ptr<pipeline::StableDiffusion> impl() const { return impl_; }

 private:
  std::shared_ptr<pipeline::StableDiffusion> impl_;
};

// Names accepted by GenerationConfig::scheduler.
std::vector<std::string> scheduler_names();

}  // namespace diffuse
