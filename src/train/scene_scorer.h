// Scores an image against a caption of the demo world (train/scene.h): is the background the
// named colour, is each object's colour present in its named region, and does that colour's
// blob have the named shape. Pixels are classified to the nearest of the world's eight colours,
// so the score is robust to the small colour errors of a generated image and to the kernels
// of another machine (tests score images instead of comparing pixels).
#pragma once
#include <string>
#include <vector>

#include "diffuse/image.h"
#include "train/scene.h"

namespace diffuse::train {

struct ObjectScore {
  bool colour_position = false;  // enough pixels of its colour in its region, centred there
  bool shape = false;            // that colour's blob in the region has the named shape
  std::string detected_shape;    // "circle", "square", "triangle" or "none"
};

struct SceneScore {
  bool background = false;
  std::string detected_background;  // colour name of the majority of border pixels
  std::vector<ObjectScore> objects;
  // No other object: no blob of a colour that neither the background nor a named object has
  // (what an edit that removes or recolours an object must leave).
  bool nothing_else = true;
  // Every check passed.
  bool all() const;
};

SceneScore score_scene(const Image& image, const SceneSpec& spec);

// Aggregates over many scored images.
struct QualityTally {
  int images = 0, background_ok = 0;
  int objects = 0, colour_position_ok = 0, shape_ok = 0;
  void add(const SceneScore& s);
  double background_accuracy() const;
  double colour_position_accuracy() const;
  double shape_accuracy() const;
};

}  // namespace diffuse::train
