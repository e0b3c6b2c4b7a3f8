// Every job of the engine behind one type and no LibTorch: load a model (Stable Diffusion,
// HiDream or FLUX.1; a diffusers folder or a single-file checkpoint), then text-to-image,
// image-to-image or an instruction edit, into plain RGB images, with progress and cancellation,
// timings and memory. The C API (diffuse/diffuse.h) and the Python module are this type seen from C
// and Python; diffuse/pipeline.h is the Stable Diffusion API with every option (LibTorch tensors
// included: latents in, latents out).
//
//   auto engine = diffuse::Engine::open("models/demo");
//   diffuse::JobRequest r;
//   r.prompt = "a red circle on the left on a blue background";
//   r.seed = 42;
//   diffuse::write_png("out.png", engine.txt2img(r).image);
#pragma once
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

struct JobRequest {
  std::string prompt;  // required
  std::string negative_prompt;
  int width = 0, height = 0;  // 0: the model's size (image-to-image and edits: the input's)
  int steps = 0;              // 0: the model's default
  std::optional<double> guidance_scale;        // unset: the model's default
  std::optional<double> strength;              // image-to-image, (0, 1]; unset: 0.8
  std::optional<double> image_guidance_scale;  // edits; unset: the model's default
  std::optional<uint64_t> seed;                // unset: a random one (the result says which)
  std::string scheduler;                       // empty: the model's own
  // Called after each step (1-based); returning false cancels the job (it throws Cancelled).
  std::function<bool(int step, int total_steps)> progress;
};

struct JobResult {
  Image image;
  uint64_t seed = 0;
  double seconds = 0;  // the whole job
  StageTimings timings;
  std::vector<std::string> warnings;  // what the user should know that did not stop the job
};

class Engine {
 public:
  // device: "auto", "cpu", "cuda[:N]", "npu[:N]"; dtype: "auto", "fp32", "bf16", "fp16".
  static Engine open(const std::string& model, const std::string& device = "auto",
                     const std::string& dtype = "auto");
  ~Engine();
  Engine(Engine&&) noexcept;
  Engine& operator=(Engine&&) noexcept;

  // "stable-diffusion", "hidream", "flux" or "qwen-image".
  std::string family() const;
  // True for a model that edits by instruction (HiDream: E1 folders, and I1 folders with E1's
  // transformer; FLUX.1 Kontext and Qwen-Image-Edit folders).
  bool can_edit() const;

  JobResult txt2img(const JobRequest& request);
  // Stable Diffusion: the input redrawn towards the prompt; HiDream and FLUX: an edit of it.
  JobResult img2img(const JobRequest& request, const Image& input);
  // Unsupported on a model that does not edit by instruction.
  JobResult edit(const JobRequest& request, const Image& input);

 private:
  struct Impl;
  explicit Engine(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace diffuse
