#include "pipeline/image_parameters.h"

#include <filesystem>
#include <sstream>

namespace diffuse::pipeline {

std::string ImageParameters::to_text() const {
  std::ostringstream os;
  os << prompt << "\n";
  if (!negative_prompt.empty()) os << "Negative prompt: " << negative_prompt << "\n";
  os << "Steps: " << steps << ", Sampler: " << scheduler << ", CFG scale: " << cfg_scale
     << ", Seed: " << seed << ", Size: " << width << "x" << height
     << ", Model: " << std::filesystem::path(model).filename().string();
  if (strength) os << ", Denoising strength: " << *strength;
  if (image_guidance) os << ", Image CFG scale: " << *image_guidance;
  os << ", Device: " << device << ", Dtype: " << dtype << ", Engine: diffuse " << DIFFUSE_VERSION;
  return os.str();
}

nlohmann::json ImageParameters::to_json() const {
  nlohmann::json j = {{"prompt", prompt},       {"negative_prompt", negative_prompt},
                      {"seed", seed},           {"steps", steps},
                      {"scheduler", scheduler}, {"cfg_scale", cfg_scale},
                      {"width", width},         {"height", height},
                      {"model", model},         {"device", device},
                      {"dtype", dtype}};
  if (strength) j["strength"] = *strength;
  if (image_guidance) j["image_guidance_scale"] = *image_guidance;
  return j;
}

std::map<std::string, std::string> ImageParameters::png_chunks() const {
  return {{"parameters", to_text()}, {"diffuse", to_json().dump()}};
}

}  // namespace diffuse::pipeline
