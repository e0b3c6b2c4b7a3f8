#include "pipeline/qwen_vl_image_processor.h"

#include <torch/torch.h>

#include <cmath>
#include <filesystem>

#include "diffuse/errors.h"
#include "io/json_config.h"
#include "models/config_values.h"

namespace diffuse::pipeline {
namespace {

std::array<float, 3> read_rgb(const io::JsonConfig& cfg, const std::string& key,
                              const std::array<float, 3>& fallback, bool positive) {
  if (!cfg.has(key)) return fallback;
  const auto v = cfg.get<std::vector<double>>(key, {});
  if (v.size() != 3) cfg.fail(key, "expected 3 numbers (one per RGB channel)");
  std::array<float, 3> out{};
  for (size_t i = 0; i < 3; ++i) {
    if (!std::isfinite(v[i]) || (positive && !(v[i] > 0)))
      cfg.fail(key, positive ? "every value must be a positive number" : "values must be finite");
    out[i] = static_cast<float>(v[i]);
  }
  return out;
}

}  // namespace

QwenVLImageProcessorConfig QwenVLImageProcessorConfig::from_folder(const std::string& dir) {
  const auto path = std::filesystem::path(dir) / "preprocessor_config.json";
  if (!std::filesystem::exists(path))
    throw IoError("image processor folder '" + dir +
                  "' has no preprocessor_config.json (the Qwen2-VL image processor's settings)");
  const auto cfg = io::JsonConfig::load(path.string());
  QwenVLImageProcessorConfig c;
  c.source = cfg.source();
  c.patch_size = models::read_int_in(cfg, "patch_size", c.patch_size, 1, 1024);
  c.merge_size = models::read_int_in(cfg, "merge_size", c.merge_size, 1, 64);
  c.temporal_patch_size =
      models::read_int_in(cfg, "temporal_patch_size", c.temporal_patch_size, 1, 64);
  // min_pixels / max_pixels, or the same values as size.shortest_edge / longest_edge.
  int64_t min_px = c.min_pixels, max_px = c.max_pixels;
  if (cfg.has("size") && cfg.json()["size"].is_object()) {
    const io::JsonConfig size(cfg.json()["size"], cfg.source() + ": size");
    min_px = models::read_int_in(size, "shortest_edge", min_px, 1, int64_t{1} << 40);
    max_px = models::read_int_in(size, "longest_edge", max_px, 1, int64_t{1} << 40);
  }
  c.min_pixels = models::read_int_in(cfg, "min_pixels", min_px, 1, int64_t{1} << 40);
  c.max_pixels = models::read_int_in(cfg, "max_pixels", max_px, 1, int64_t{1} << 40);
  if (c.min_pixels > c.max_pixels)
    cfg.fail("min_pixels",
             std::to_string(c.min_pixels) + " is above max_pixels " + std::to_string(c.max_pixels));
  c.do_resize = cfg.get<bool>("do_resize", true);
  c.do_rescale = cfg.get<bool>("do_rescale", true);
  c.do_normalize = cfg.get<bool>("do_normalize", true);
  c.rescale_factor = cfg.get<double>("rescale_factor", c.rescale_factor);
  if (!std::isfinite(c.rescale_factor) || !(c.rescale_factor > 0))
    cfg.fail("rescale_factor", "must be a positive number");
  c.image_mean = read_rgb(cfg, "image_mean", c.image_mean, false);
  c.image_std = read_rgb(cfg, "image_std", c.image_std, true);
  // PIL's resampling codes: 1 LANCZOS, 3 BICUBIC.
  const int64_t resample = cfg.get<int64_t>("resample", 3);
  if (resample == 3)
    c.resample = io::PillowFilter::kBicubic;
  else if (resample == 1)
    c.resample = io::PillowFilter::kLanczos;
  else
    cfg.fail("resample", "PIL filter " + std::to_string(resample) +
                             " is not supported (expected 3 = BICUBIC or 1 = LANCZOS)");
  return c;
}

std::pair<int64_t, int64_t> qwen_smart_resize(int64_t height, int64_t width, int64_t factor,
                                              int64_t min_pixels, int64_t max_pixels) {
  if (height < 1 || width < 1)
    throw InvalidArgument("Qwen2-VL image processor: the image is empty (" + std::to_string(width) +
                          "x" + std::to_string(height) + ")");
  const double aspect = static_cast<double>(std::max(height, width)) / std::min(height, width);
  if (aspect > 200)
    throw InvalidArgument(
        "Qwen2-VL image processor: absolute aspect ratio must be at most 200, "
        "got " +
        std::to_string(aspect) + " (" + std::to_string(width) + "x" + std::to_string(height) + ")");
  const double f = static_cast<double>(factor);
  // Python's round() rounds halves to even, as nearbyint does in the default rounding mode.
  int64_t h_bar = static_cast<int64_t>(std::nearbyint(height / f)) * factor;
  int64_t w_bar = static_cast<int64_t>(std::nearbyint(width / f)) * factor;
  if (h_bar * w_bar > max_pixels) {
    const double beta = std::sqrt(static_cast<double>(height) * width / max_pixels);
    h_bar = std::max(factor, static_cast<int64_t>(std::floor(height / beta / f)) * factor);
    w_bar = std::max(factor, static_cast<int64_t>(std::floor(width / beta / f)) * factor);
  } else if (h_bar * w_bar < min_pixels) {
    const double beta = std::sqrt(min_pixels / (static_cast<double>(height) * width));
    h_bar = static_cast<int64_t>(std::ceil(height * beta / f)) * factor;
    w_bar = static_cast<int64_t>(std::ceil(width * beta / f)) * factor;
  }
  return {h_bar, w_bar};
}

QwenVLImageInput qwen_vl_preprocess(const torch::Tensor& image_u8,
                                    const QwenVLImageProcessorConfig& c) {
  if (!image_u8.defined() || image_u8.scalar_type() != torch::kUInt8 || image_u8.dim() != 3 ||
      image_u8.size(2) != 3)
    throw InvalidArgument("Qwen2-VL image processor: expected an RGB uint8 image [H, W, 3], got " +
                          (image_u8.defined() ? c10::str(image_u8.sizes()) : std::string("none")));
  int64_t H = image_u8.size(0), W = image_u8.size(1);
  auto image = image_u8;
  if (c.do_resize) {
    const auto [h, w] = qwen_smart_resize(H, W, c.factor(), c.min_pixels, c.max_pixels);
    if (h > models::kMaxImageSide * 4 || w > models::kMaxImageSide * 4)
      throw InvalidArgument("Qwen2-VL image processor: " + std::to_string(W) + "x" +
                            std::to_string(H) + " would be resized to " + std::to_string(w) + "x" +
                            std::to_string(h) + ", larger than the processor can take");
    image = io::pillow_resize(image_u8, h, w, c.resample);
    H = h, W = w;
  }
  if (H % c.factor() != 0 || W % c.factor() != 0)
    throw InvalidArgument(
        "Qwen2-VL image processor: without resizing the image must be a "
        "multiple of " +
        std::to_string(c.factor()) + " pixels per side, got " + std::to_string(W) + "x" +
        std::to_string(H));
  // transformers' rescale multiplies in float64 and stores float32; normalize in float32.
  auto x = image.permute({2, 0, 1}).to(torch::kFloat64);
  if (c.do_rescale) x = x * c.rescale_factor;
  x = x.to(torch::kFloat32);
  if (c.do_normalize) {
    auto mean = torch::tensor({c.image_mean[0], c.image_mean[1], c.image_mean[2]}).view({3, 1, 1});
    auto std = torch::tensor({c.image_std[0], c.image_std[1], c.image_std[2]}).view({3, 1, 1});
    x = (x - mean) / std;
  }
  const int64_t T = c.temporal_patch_size, P = c.patch_size, M = c.merge_size;
  // One frame repeated to a whole temporal patch.
  auto frames = x.unsqueeze(0).expand({T, 3, H, W});
  const int64_t gh = H / P, gw = W / P;
  QwenVLImageInput out;
  out.grid_thw = {1, gh, gw};
  out.pixel_values = frames.reshape({1, T, 3, gh / M, M, P, gw / M, M, P})
                         .permute({0, 3, 6, 4, 7, 2, 1, 5, 8})
                         .reshape({gh * gw, 3 * T * P * P})
                         .contiguous();
  return out;
}

}  // namespace diffuse::pipeline
