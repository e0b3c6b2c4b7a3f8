// `diffuse train-demo`: trains the demo model from scratch on the scene world (train/scene.h)
// with LibTorch's autograd and the engine's own modules: first the AutoencoderKL
// (reconstruction + a small KL term), then the UNet together with the CLIP text encoder (with
// a BPE vocabulary learned from the world's captions) on the VAE's latents. The result is a
// diffusers-layout folder that the normal txt2img/img2img path loads.
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <string>

namespace diffuse::train {

struct TrainDemoOptions {
  // "sd" (the Stable-Diffusion-architecture demo) or "hidream-e1" (the HiDream-architecture
  // text-to-image and instruction-editing demo, train/hidream_demo_trainer.h).
  std::string arch = "sd";
  std::string out;     // the model folder to write
  bool force = false;  // replace an existing non-empty folder
  uint64_t seed = 1;
  double minutes = 60;     // time budget for the whole run (used when the step counts are 0)
  int64_t vae_steps = 0;   // 0: as many as the VAE's share of the budget allows
  int64_t unet_steps = 0;  // the denoiser's (UNet or transformer) steps
  int resolution = 128;    // training images are resolution x resolution
  int vae_batch = 16;
  int vae_crop = 64;             // the autoencoder trains on random crops of this size
  int unet_batch = 32;           // denoiser batch
  int64_t dataset_size = 16384;  // scenes (edit pairs for hidream-e1) pre-encoded
  bool half_precision_weights = true;
  // "auto" (bf16 where the engine's dtype policy picks it for the CPU, i.e. native bf16
  // dot products), "fp32" or "bf16": bf16 runs the forward and backward passes under
  // autocast (matmuls and convolutions in bf16, weights and optimizer in float32).
  std::string precision = "auto";
  // Peak learning rate of the denoiser stage's warm-up + cosine schedule; 0 = the architecture's
  // own (4e-4 SD, 5e-4 HiDream). A continuation (--init-from) does better with a lower peak: a
  // short run restarted at the full peak undid part of what the earlier run had learned.
  double learning_rate = 0;
  // hidream-e1 only: a folder an earlier run of the same architecture and resolution wrote, to
  // continue from: its tokenizers, configs and weights are the start (the autoencoder and its
  // latents' shift and scale are kept, so the autoencoder stage is skipped), and its training
  // record is kept inside the new one.
  std::string init_from;
  // hidream-e1 only: how often each edit kind is drawn (train/scene_edit.h, parse_edit_mix):
  // "natural" or "kind=weight,...".
  std::string edit_mix = "natural";
};

struct TrainProgress {
  std::string stage;  // "vae", "encode", "unet"
  int64_t step = 0;   // 1-based, done so far
  int64_t total = 0;
  double loss = 0;  // running mean of recent steps
  double stage_elapsed_s = 0;
  double eta_s = 0;  // for the stage
};
using TrainCallback = std::function<void(const TrainProgress&)>;

struct TrainReport {
  int64_t vae_steps = 0, unet_steps = 0;
  double vae_loss = 0, unet_loss = 0;  // running means at the end
  double vae_s = 0, encode_s = 0, unet_s = 0, total_s = 0;
  double scaling_factor = 0;
  double shift_factor = 0;  // hidream-e1 (Flux-style VAE)
  int64_t parameters = 0;   // all three networks
  std::string record;       // the training record written into the folder (JSON)
};

// Trains and writes the folder. The folder is written under a temporary name next to `out`
// and renamed into place only when complete, so an interrupted run (cancel set, an error)
// leaves no half-written model. InvalidArgument when `out` is a non-empty folder or a file
// and force is off (before any training). With both step counts given, a run is deterministic
// for a seed on one machine; with a time budget the counts are fixed after timing the first
// steps and written into the training record, so the run can be repeated exactly.
TrainReport train_demo(const TrainDemoOptions& options, const TrainCallback& on_progress = {},
                       const std::atomic<bool>* cancel = nullptr);

}  // namespace diffuse::train
