// Control-image preprocessors (pipeline/control_image.h). Canny comes from OpenCV (Debian's
// libopencv-dev), compiled in where the build found it (DIFFUSE_WITH_OPENCV on this file only).
#include <torch/torch.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "diffuse/errors.h"
#include "pipeline/control_image.h"
#include "pipeline/inpaint_mask.h"

#ifdef DIFFUSE_WITH_OPENCV
#include <opencv2/imgproc.hpp>
#include <opencv2/photo.hpp>
#endif

namespace diffuse::pipeline {
namespace {

struct Spec {
  std::string name;
  double low = 100, high = 200;
};

double parse_threshold(const std::string& text, const std::string& spec) {
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0' || !(v >= 0 && v <= 10000))
    throw InvalidArgument("control preprocessor '" + spec + "': threshold '" + text +
                          "' is not a number in [0, 10000]");
  return v;
}

Spec parse(const std::string& spec) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (true) {
    const size_t colon = spec.find(':', start);
    parts.push_back(spec.substr(start, colon - start));
    if (colon == std::string::npos) break;
    start = colon + 1;
  }
  Spec s;
  s.name = parts[0];
  if (s.name.empty() || s.name == "none") {
    if (parts.size() > 1) throw InvalidArgument("control preprocessor 'none' takes no values");
    s.name = "none";
    return s;
  }
  if (s.name != "canny")
    throw InvalidArgument("unknown control preprocessor '" + spec +
                          "' (expected none, canny or canny:LOW:HIGH)");
  if (parts.size() != 1 && parts.size() != 3)
    throw InvalidArgument("control preprocessor '" + spec + "': expected canny or canny:LOW:HIGH");
  if (parts.size() == 3) {
    s.low = parse_threshold(parts[1], spec);
    s.high = parse_threshold(parts[2], spec);
    if (s.low > s.high)
      throw InvalidArgument("control preprocessor '" + spec +
                            "': the low threshold is above the high one");
  }
  return s;
}

}  // namespace

void validate_control_preprocessor(const std::string& spec) {
  const auto s = parse(spec);
#ifndef DIFFUSE_WITH_OPENCV
  if (s.name == "canny")
    throw Unsupported(
        "control preprocessor canny: this build has no OpenCV (install "
        "libopencv-dev and rebuild), or pass an edge image as it is");
#endif
}

torch::Tensor apply_control_preprocessor(const torch::Tensor& image, const std::string& spec) {
  validate_control_preprocessor(spec);
  const auto s = parse(spec);
  if (s.name == "none") return image;
  if (!image.defined() || image.scalar_type() != torch::kUInt8 || image.dim() != 3 ||
      image.size(2) != 3)
    throw InvalidArgument("control preprocessor canny: expected an RGB image uint8 [H, W, 3]");
#ifdef DIFFUSE_WITH_OPENCV
  auto rgb = image.contiguous();
  cv::Mat in(static_cast<int>(rgb.size(0)), static_cast<int>(rgb.size(1)), CV_8UC3,
             rgb.data_ptr<uint8_t>());
  cv::Mat edges;
  cv::Canny(in, edges, s.low, s.high);
  auto out = torch::from_blob(edges.data, {edges.rows, edges.cols}, torch::kUInt8).clone();
  return out.unsqueeze(2).repeat({1, 1, 3}).contiguous();
#else
  return image;  // not reached: validate_control_preprocessor refused
#endif
}

void validate_inpaint_fill(const std::string& fill) {
  if (fill != "original" && fill != "fill" && fill != "latent_noise" && fill != "latent_nothing")
    throw InvalidArgument(
        "inpaint fill: expected original, fill, latent_noise or latent_nothing, "
        "got \"" +
        fill + "\"");
#ifndef DIFFUSE_WITH_OPENCV
  if (fill == "fill")
    throw Unsupported(
        "inpaint fill \"fill\": this build has no OpenCV (install libopencv-dev "
        "and rebuild), or use original, latent_noise or latent_nothing");
#endif
}

torch::Tensor fill_masked_region(const torch::Tensor& image, const torch::Tensor& binary_mask) {
  validate_inpaint_fill("fill");
#ifdef DIFFUSE_WITH_OPENCV
  auto rgb = image.contiguous();
  auto m = (binary_mask.squeeze(0).squeeze(0) >= 0.5).to(torch::kUInt8).mul(255).contiguous();
  const int h = static_cast<int>(rgb.size(0)), w = static_cast<int>(rgb.size(1));
  cv::Mat in(h, w, CV_8UC3, rgb.data_ptr<uint8_t>());
  cv::Mat mask(h, w, CV_8UC1, m.data_ptr<uint8_t>());
  cv::Mat out;
  cv::inpaint(in, mask, out, 3.0, cv::INPAINT_TELEA);
  return torch::from_blob(out.data, {h, w, 3}, torch::kUInt8).clone();
#else
  return image;  // not reached: validate_inpaint_fill refused
#endif
}

}  // namespace diffuse::pipeline
