// `diffuse bench demo-quality --edit`: how well the HiDream-architecture demo model
// (models/demo-edit, `diffuse train-demo --arch hidream-e1`) edits and draws. Held-out edits
// (train/scene_edit.h: sources never trained on, every kind of instruction) run in E1's prompt
// format with several seeds; each result is scored against the scene the instruction asks for
// (the edit applied AND everything else kept), next to the score of the unedited source against
// the same scene (what doing nothing would score). Text-to-image is scored on held-out captions.
#pragma once
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "accel/dit_cache.h"
#include "diffuse/pipeline.h"
#include "train/scene_scorer.h"

namespace diffuse::pipeline {
class HiDreamPipeline;
struct HiDreamDefaults;
}  // namespace diffuse::pipeline

namespace diffuse::bench {

struct DemoEditQualityOptions {
  std::string model = "models/demo-edit";
  int edits = 60;    // held-out edits
  int seeds = 2;     // seeds 0..seeds-1 per edit and per prompt
  int prompts = 50;  // held-out captions for text-to-image (0: none)
  // <= 0 / < 0: the folder's defaults (model_index.json's _diffuse_defaults).
  int steps = 0;
  double guidance_scale = -1, image_guidance_scale = -1;
  std::string device = "auto";
  std::string dtype = "auto";
  std::string weights = "none";  // the transformer's linear weights: none|q8_0|q4_0
  std::string save_dir;          // when set, every source and result is written there as PNG
  DitCacheOptions cache;         // off: every transformer block runs
  bool keep_images = false;  // the results in DemoEditQualityResult::images (edits, then txt2img)
  std::function<void(const std::string&)> log;
};

struct EditTally {
  train::QualityTally scores;  // per object and background, against the target scene
  int fully_right = 0;         // results whose every check passed
  double fully_right_rate() const {
    return scores.images ? static_cast<double>(fully_right) / scores.images : 0.0;
  }
  // Objects whose colour, place and shape are all right, over all objects.
  int objects_right = 0;
  double objects_right_rate() const {
    return scores.objects ? static_cast<double>(objects_right) / scores.objects : 0.0;
  }
  void add(const train::SceneScore& s);
};

struct DemoEditQualityResult {
  EditTally edits, unedited;               // results vs the target; sources vs the target
  EditTally autoencoder;                   // sources through the VAE and back vs the sources
  std::map<std::string, EditTally> kinds;  // results per kind of edit
  EditTally txt2img;
  int steps = 0;
  double guidance_scale = 0, image_guidance_scale = 0;
  double seconds = 0;
  double denoise_s = 0;               // the denoising loops' time, summed over every image
  accel::DitCacheStats cache;         // summed over every image
  std::vector<torch::Tensor> images;  // with keep_images: [1, H, W, 3] float in [0, 1]
};

DemoEditQualityResult run_demo_edit_quality(const DemoEditQualityOptions& options);
// On a pipeline already loaded from options.model, with its folder's defaults.
DemoEditQualityResult run_demo_edit_quality(pipeline::HiDreamPipeline& pipe,
                                            const pipeline::HiDreamDefaults& defaults,
                                            const DemoEditQualityOptions& options);

}  // namespace diffuse::bench
