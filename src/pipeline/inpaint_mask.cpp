#include "pipeline/inpaint_mask.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>

#include "diffuse/errors.h"
#include "io/pillow_resample.h"
#include "pipeline/denoise_extras.h"

namespace diffuse::pipeline {
namespace {

torch::Tensor resize_u8(const torch::Tensor& hwc, int64_t h, int64_t w) {
  if (hwc.size(0) == h && hwc.size(1) == w) return hwc;  // PIL: same size = a copy
  return io::pillow_lanczos_resize(hwc, h, w);
}

// a >> bits for the non-negative integers of Pillow's fixed-point arithmetic.
torch::Tensor shr(const torch::Tensor& a, int bits) {
  return torch::div(a, int64_t{1} << bits, "floor");
}

// Pillow's DIV255 (Paste.c / Convert.c): (a + 128 + ((a + 128) >> 8)) >> 8.
torch::Tensor div255(const torch::Tensor& a) {
  auto t = a + 128;
  return shr(shr(t, 8) + t, 8);
}

// VaeImageProcessor._resize_and_crop: cover height x width, centred, cut what overflows.
torch::Tensor resize_and_crop(const torch::Tensor& image, int64_t height, int64_t width) {
  const int64_t ih = image.size(0), iw = image.size(1);
  const double ratio = static_cast<double>(width) / height;
  const double src_ratio = static_cast<double>(iw) / ih;
  const int64_t src_w = ratio > src_ratio ? width : iw * height / ih;
  const int64_t src_h = ratio <= src_ratio ? height : ih * width / iw;
  const auto resized = resize_u8(image, src_h, src_w);
  auto out = torch::zeros({height, width, image.size(2)}, torch::kUInt8);
  // paste at (width/2 - src_w/2, height/2 - src_h/2), clipped to the canvas.
  const int64_t x0 = width / 2 - src_w / 2, y0 = height / 2 - src_h / 2;
  const int64_t sx = std::max<int64_t>(0, -x0), sy = std::max<int64_t>(0, -y0);
  const int64_t dx = std::max<int64_t>(0, x0), dy = std::max<int64_t>(0, y0);
  const int64_t cw = std::min(src_w - sx, width - dx), ch = std::min(src_h - sy, height - dy);
  if (cw > 0 && ch > 0)
    out.slice(0, dy, dy + ch)
        .slice(1, dx, dx + cw)
        .copy_(resized.slice(0, sy, sy + ch).slice(1, sx, sx + cw));
  return out;
}

}  // namespace

torch::Tensor mask_to_gray(const torch::Tensor& mask) {
  if (!mask.defined() || mask.scalar_type() != torch::kUInt8 || mask.dim() < 2 || mask.dim() > 3 ||
      (mask.dim() == 3 && mask.size(2) != 1 && mask.size(2) != 3 && mask.size(2) != 4) ||
      mask.size(0) < 1 || mask.size(1) < 1)
    throw InvalidArgument("mask: expected an 8-bit image [H, W] (grey) or [H, W, 1|3|4], got " +
                          (mask.defined()
                               ? c10::str(mask.sizes()) + " " + c10::toString(mask.scalar_type())
                               : std::string("none")));
  if (mask.dim() == 2) return mask.contiguous();
  if (mask.size(2) == 1) return mask.select(2, 0).contiguous();
  // ITU-R 601-2 luma in Pillow's fixed point: (R*19595 + G*38470 + B*7471 + 0x8000) >> 16.
  const auto c = mask.to(torch::kInt64);
  const auto l =
      shr(c.select(2, 0) * 19595 + c.select(2, 1) * 38470 + c.select(2, 2) * 7471 + 0x8000, 16);
  return l.to(torch::kUInt8).contiguous();
}

torch::Tensor adjust_mask(const torch::Tensor& gray, bool invert, double blur) {
  auto g = gray;
  if (invert) g = 255 - g;
  if (!(blur >= 0) || blur > 256)
    throw InvalidArgument("mask blur must be in [0, 256] pixels, got " + std::to_string(blur));
  if (blur > 0) {
    // A separable Gaussian of standard deviation `blur`, edges replicated.
    const int64_t radius = static_cast<int64_t>(std::ceil(3 * blur));
    auto x = torch::arange(-radius, radius + 1, torch::kFloat64);
    auto k = torch::exp(-(x * x) / (2 * blur * blur));
    k = (k / k.sum()).to(torch::kFloat32);
    namespace F = torch::nn::functional;
    auto img = g.to(torch::kFloat32).unsqueeze(0).unsqueeze(0);
    img = F::pad(img, F::PadFuncOptions({radius, radius, radius, radius}).mode(torch::kReplicate));
    img = F::conv2d(img, k.view({1, 1, 1, -1}));
    img = F::conv2d(img, k.view({1, 1, -1, 1}));
    g = img.squeeze(0).squeeze(0).round().clamp(0, 255).to(torch::kUInt8).contiguous();
  }
  return g;
}

torch::Tensor preprocess_mask(const torch::Tensor& mask, int64_t height, int64_t width) {
  mask_to_gray(mask);  // validates
  // Resized in its own mode, converted to L after (as VaeImageProcessor does).
  auto m = mask.dim() == 2 ? mask.unsqueeze(2) : mask;
  m = resize_u8(m.contiguous(), height, width);
  const auto gray = mask_to_gray(m.size(2) == 1 ? m.select(2, 0) : m);
  const auto v = gray.to(torch::kFloat32) / 255;
  return (v >= 0.5).to(torch::kFloat32).unsqueeze(0).unsqueeze(0);
}

torch::Tensor latent_mask(const torch::Tensor& binary_mask, int64_t latent_height,
                          int64_t latent_width) {
  namespace F = torch::nn::functional;
  return F::interpolate(binary_mask, F::InterpolateFuncOptions()
                                         .size(std::vector<int64_t>{latent_height, latent_width})
                                         .mode(torch::kNearest));
}

torch::Tensor masked_image(const torch::Tensor& image, const torch::Tensor& binary_mask) {
  return image * (binary_mask.to(image.device()) < 0.5);
}

bool mask_is_empty(const torch::Tensor& binary_mask) {
  return !(binary_mask >= 0.5).any().item<bool>();
}

bool mask_is_full(const torch::Tensor& binary_mask) {
  return (binary_mask >= 0.5).all().item<bool>();
}

CropBox mask_crop_region(const torch::Tensor& gray, int64_t width, int64_t height, int64_t pad) {
  const int64_t h = gray.size(0), w = gray.size(1);
  const auto cols = (gray != 0).any(0), rows = (gray != 0).any(1);
  if (!rows.any().item<bool>())
    throw InvalidArgument("mask crop: the mask is all black (nothing to repaint)");
  const auto nz_cols = cols.nonzero(), nz_rows = rows.nonzero();
  const int64_t left = nz_cols.min().item<int64_t>(), right = w - 1 - nz_cols.max().item<int64_t>();
  const int64_t top = nz_rows.min().item<int64_t>(), bottom = h - 1 - nz_rows.max().item<int64_t>();
  int64_t x1 = std::max<int64_t>(left - pad, 0), y1 = std::max<int64_t>(top - pad, 0);
  int64_t x2 = std::min<int64_t>(w - right + pad, w), y2 = std::min<int64_t>(h - bottom + pad, h);
  const double ratio_crop = static_cast<double>(x2 - x1) / (y2 - y1);
  const double ratio_processing = static_cast<double>(width) / height;
  // Python's // floors; int() truncates (the differences are >= 0 here).
  const auto floordiv2 = [](int64_t v) { return v >= 0 ? v / 2 : -((-v + 1) / 2); };
  if (ratio_crop > ratio_processing) {
    const double desired = (x2 - x1) / ratio_processing;
    const int64_t diff = static_cast<int64_t>(desired - (y2 - y1));
    y1 -= floordiv2(diff);
    y2 += diff - floordiv2(diff);
    if (y2 >= h) {
      const int64_t d = y2 - h;
      y2 -= d;
      y1 -= d;
    }
    if (y1 < 0) {
      y2 -= y1;
      y1 = 0;
    }
    if (y2 >= h) y2 = h;
  } else {
    const double desired = (y2 - y1) * ratio_processing;
    const int64_t diff = static_cast<int64_t>(desired - (x2 - x1));
    x1 -= floordiv2(diff);
    x2 += diff - floordiv2(diff);
    if (x2 >= w) {
      const int64_t d = x2 - w;
      x2 -= d;
      x1 -= d;
    }
    if (x1 < 0) {
      x2 -= x1;
      x1 = 0;
    }
    if (x2 >= w) x2 = w;
  }
  return {x1, y1, x2, y2};
}

torch::Tensor crop_and_fill(const torch::Tensor& image, const CropBox& box, int64_t height,
                            int64_t width) {
  const auto [x1, y1, x2, y2] = box;
  if (x1 < 0 || y1 < 0 || x2 > image.size(1) || y2 > image.size(0) || x2 <= x1 || y2 <= y1)
    throw InvalidArgument("crop box (" + std::to_string(x1) + ", " + std::to_string(y1) + ", " +
                          std::to_string(x2) + ", " + std::to_string(y2) +
                          ") is not inside the image " + c10::str(image.sizes()));
  const auto crop = image.slice(0, y1, y2).slice(1, x1, x2).contiguous();
  const int64_t ih = crop.size(0), iw = crop.size(1);
  const double ratio = static_cast<double>(width) / height;
  const double src_ratio = static_cast<double>(iw) / ih;
  const int64_t src_w = ratio < src_ratio ? width : iw * height / ih;
  const int64_t src_h = ratio >= src_ratio ? height : ih * width / iw;
  const auto resized = resize_u8(crop, src_h, src_w);
  auto out = torch::zeros({height, width, image.size(2)}, torch::kUInt8);
  const int64_t x0 = width / 2 - src_w / 2, y0 = height / 2 - src_h / 2;
  out.slice(0, y0, y0 + src_h).slice(1, x0, x0 + src_w).copy_(resized);
  // The strips the resized crop does not cover take its edge rows / columns (diffusers
  // resizes a zero-width box of the edge; at the one or two pixels get_crop_region leaves,
  // the edge itself).
  if (y0 > 0) out.slice(0, 0, y0).copy_(out.slice(0, y0, y0 + 1).expand({y0, width, -1}));
  if (y0 + src_h < height)
    out.slice(0, y0 + src_h, height)
        .copy_(out.slice(0, y0 + src_h - 1, y0 + src_h).expand({height - y0 - src_h, width, -1}));
  if (x0 > 0) out.slice(1, 0, x0).copy_(out.slice(1, x0, x0 + 1).expand({height, x0, -1}));
  if (x0 + src_w < width)
    out.slice(1, x0 + src_w, width)
        .copy_(out.slice(1, x0 + src_w - 1, x0 + src_w).expand({height, width - x0 - src_w, -1}));
  return out;
}

torch::Tensor apply_overlay(const torch::Tensor& gray_mask, const torch::Tensor& source,
                            const torch::Tensor& generated, const CropBox* box) {
  const int64_t H = source.size(0), W = source.size(1);
  const auto mask = resize_u8(gray_mask.unsqueeze(2).contiguous(), H, W).select(2, 0);
  // The generated picture on a canvas of the source's size: in the crop box, black outside.
  torch::Tensor gen;
  if (box) {
    const auto [x1, y1, x2, y2] = *box;
    gen = torch::zeros({H, W, 3}, torch::kUInt8);
    gen.slice(0, y1, y2).slice(1, x1, x2).copy_(resize_and_crop(generated, y2 - y1, x2 - x1));
  } else {
    gen = resize_u8(generated, H, W);
  }
  // The source, premultiplied by alpha a = 255 - mask (paste into a transparent RGBa canvas
  // through an L mask: DIV255(c * a)), then back to RGBA (unpremultiplied: 255 * c / a).
  const auto a = (255 - mask.to(torch::kInt32)).unsqueeze(2);
  const auto src = source.to(torch::kInt32);
  const auto pre = div255(src * a);
  auto straight = torch::where(a == 255, pre, torch::clamp((255 * pre) / a.clamp_min(1), 0, 255));
  straight = torch::where(a == 0, pre, straight);
  // alpha_composite(source over generated), the generated image opaque (Pillow,
  // AlphaComposite.c, PRECISION_BITS 7).
  constexpr int64_t kPrecision = 7;
  const auto a64 = a.to(torch::kInt64);
  const auto blend = 255 * (255 - a64);
  const auto outa255 = a64 * 255 + blend;
  const auto coef1 = a64 * 255 * 255 * (int64_t{1} << kPrecision) / outa255;
  const auto coef2 = 255 * (int64_t{1} << kPrecision) - coef1;
  const auto tmp = straight.to(torch::kInt64) * coef1 + gen.to(torch::kInt64) * coef2 +
                   (int64_t{0x80} << kPrecision);
  const auto shifted = shr(shr(shr(tmp, 8) + tmp, 8), kPrecision);
  const auto out = torch::where(a64 == 0, gen.to(torch::kInt64), shifted);
  return out.clamp(0, 255).to(torch::kUInt8).contiguous();
}

torch::Tensor InpaintLatents::network_input(const torch::Tensor& model_input, bool guidance) const {
  if (!concat) return model_input;
  auto m = mask.to(model_input.device(), model_input.scalar_type());
  auto mi = masked_image_latents.to(model_input.device(), model_input.scalar_type());
  if (guidance) {
    m = torch::cat({m, m});
    mi = torch::cat({mi, mi});
  }
  return torch::cat({model_input, m, mi}, 1);
}

torch::Tensor InpaintLatents::blend(const torch::Tensor& latents,
                                    const torch::Tensor& known) const {
  if (concat) return latents;
  const auto m = mask.to(latents.device(), latents.scalar_type());
  return (1 - m) * known + m * latents;
}

PreparedInpaint prepare_inpaint(const InpaintOptions& opt, const torch::Tensor& source,
                                int64_t height, int64_t width) {
  PreparedInpaint p;
  p.source = source.contiguous();
  const int64_t H0 = source.size(0), W0 = source.size(1);
  auto gray = mask_to_gray(opt.mask);
  if (gray.size(0) != H0 || gray.size(1) != W0)
    gray = io::pillow_lanczos_resize(gray.unsqueeze(2).contiguous(), H0, W0).select(2, 0);
  p.gray = adjust_mask(gray, opt.invert, opt.blur);
  torch::Tensor mask_u8;
  if (opt.crop_padding >= 0) {
    p.box = mask_crop_region(p.gray, width, height, opt.crop_padding);
    p.image = crop_and_fill(p.source, *p.box, height, width);
    mask_u8 = crop_and_fill(p.gray.unsqueeze(2).contiguous(), *p.box, height, width).select(2, 0);
  } else {
    p.image = resize_u8(p.source, height, width);
    mask_u8 = p.gray;
  }
  p.mask = preprocess_mask(mask_u8, height, width);
  if (mask_is_empty(p.mask))
    throw InvalidArgument(
        "the mask is all black: nothing to repaint (white = repaint, black = keep; "
        "--invert-mask swaps them)");
  return p;
}

torch::Tensor finish_inpaint(const PreparedInpaint& p, const torch::Tensor& generated) {
  if (!p.box) return generated;
  return apply_overlay(p.gray, p.source, generated, &*p.box);
}

torch::Tensor finish_inpaint_images(const PreparedInpaint& p, const torch::Tensor& images) {
  if (!p.box) return images;
  std::vector<torch::Tensor> out;
  for (int64_t i = 0; i < images.size(0); ++i) {
    // As the image is saved: (x * 255).round() in 8 bits.
    const auto u8 = (images[i] * 255).round().clamp(0, 255).to(torch::kUInt8).contiguous();
    out.push_back(finish_inpaint(p, u8).to(torch::kFloat32) / 255);
  }
  return torch::stack(out);
}

}  // namespace diffuse::pipeline
