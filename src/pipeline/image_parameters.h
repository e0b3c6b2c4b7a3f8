// What made an image, written into its PNG: the "parameters" tEXt chunk in AUTOMATIC1111's
// format (which image viewers and web UIs read back) and a "diffuse" chunk with the same as
// JSON. The CLI and the server write the same chunks.
#pragma once
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

namespace diffuse::pipeline {

struct ImageParameters {
  std::string prompt, negative_prompt;
  int steps = 0;
  std::string scheduler;
  double cfg_scale = 0;
  uint64_t seed = 0;
  int width = 0, height = 0;
  std::string model;               // the path it was loaded from; the text shows its last component
  std::optional<double> strength;  // img2img
  std::optional<double> image_guidance;  // instruction edits (HiDream-E1)
  std::string device, dtype;

  std::string to_text() const;
  nlohmann::json to_json() const;
  // {"parameters": to_text(), "diffuse": to_json()}
  std::map<std::string, std::string> png_chunks() const;
};

}  // namespace diffuse::pipeline
