#include "pipeline/control_image.h"

#include <torch/torch.h>

#include "diffuse/errors.h"
#include "io/pillow_resample.h"

namespace diffuse::pipeline {

torch::Tensor preprocess_control_image(const torch::Tensor& image, int64_t height, int64_t width) {
  if (height < 1 || width < 1) throw InvalidArgument("control image: target size must be positive");
  auto img = image;
  if (img.defined() && img.is_floating_point() && img.dim() == 4 && img.size(0) == 1)
    img = img.squeeze(0);
  if (!img.defined() || img.dim() != 3 || img.size(2) != 3 || img.size(0) < 1 || img.size(1) < 1)
    throw InvalidArgument("control image: expected an RGB image [H, W, 3], got " +
                          (img.defined() ? c10::str(image.sizes()) : std::string("none")));
  if (img.scalar_type() == torch::kUInt8) {
    auto resized = img.size(0) == height && img.size(1) == width
                       ? img
                       : io::pillow_lanczos_resize(img.contiguous(), height, width);
    return (resized.to(torch::kFloat32) / 255).permute({2, 0, 1}).unsqueeze(0).contiguous();
  }
  if (!img.is_floating_point())
    throw InvalidArgument("control image: expected uint8 or floating-point values, got " +
                          std::string(c10::toString(img.scalar_type())));
  namespace F = torch::nn::functional;
  auto nchw = img.to(torch::kFloat32).permute({2, 0, 1}).unsqueeze(0);
  if (img.size(0) != height || img.size(1) != width)
    nchw = F::interpolate(nchw, F::InterpolateFuncOptions()
                                    .size(std::vector<int64_t>{height, width})
                                    .mode(torch::kNearest));
  return nchw.contiguous();
}

}  // namespace diffuse::pipeline
