// `diffuse bench demo-quality`: how well a demo-world model (models/demo, made by
// `diffuse train-demo`) draws what it is asked. Generates each held-out prompt (never trained
// on verbatim) with several seeds, scores every image with the scene scorer, and checks
// image-to-image: a rendered scene with a changed background colour in the prompt; and
// inpainting: the masked half of a scene redrawn with the object the prompt names there.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "train/scene_scorer.h"

namespace diffuse::bench {

struct DemoQualityOptions {
  std::string model = "models/demo";
  int prompts = 50;  // the first N held-out prompts
  int seeds = 4;     // seeds 0..seeds-1 per prompt
  int steps = 20;
  double guidance_scale = 7.5;
  std::string device = "auto";
  std::string dtype = "auto";
  std::string weights = "none";  // the UNet's linear weights: none|q8_0|q4_0 (LoadOptions)
  int img2img_cases = 20;        // rendered scenes whose background the prompt changes
  double strength = 0.6;
  // Inpainting: two-object scenes whose right half is masked, the prompt naming another object
  // there; scored on the new scene, and on how much the kept left half changed.
  int inpaint_cases = 0;
  std::string save_dir;  // when set, every generated image is written there as PNG
  std::function<void(const std::string&)> log;
};

struct DemoQualityRow {
  std::string prompt;
  uint64_t seed = 0;
  train::SceneScore score;
};

struct DemoQualityResult {
  train::QualityTally txt2img;
  train::QualityTally img2img;     // background = the new colour; objects = kept in place
  train::QualityTally inpaint;     // the wanted scene: the kept left object and the new right one
  int inpaint_fully_right = 0;     // every check of the wanted scene passed
  double inpaint_kept_change = 0;  // mean |out - source| over the kept half, in 8-bit levels
  std::vector<DemoQualityRow> rows;
  double seconds = 0;
};

DemoQualityResult run_demo_quality(const DemoQualityOptions& options);

}  // namespace diffuse::bench
