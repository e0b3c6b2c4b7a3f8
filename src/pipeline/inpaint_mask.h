// Inpainting masks as the diffusers inpainting pipelines read them, once for every family:
// the mask image to a binary full-size mask (white = repaint), the latent mask, the masked
// source image, the crop around the mask ("inpaint only masked": padding_mask_crop) and the
// overlay that pastes the generated crop back over the untouched source. Images are uint8
// [H, W, C] tensors on the CPU, as PIL holds them; the integer arithmetic is Pillow's.
#pragma once
#include <torch/types.h>

#include "diffuse/pipeline.h"

#include <array>
#include <cstdint>
#include <optional>
#include <string>

namespace diffuse::pipeline {

// (x1, y1, x2, y2) in source pixels, x2/y2 exclusive: PIL's crop box.
using CropBox = std::array<int64_t, 4>;

// A mask image (uint8 [H, W], [H, W, 1], [H, W, 3] or [H, W, 4]; RGBA uses its colour, not its
// alpha) as Pillow's convert("L") gives it: uint8 [H, W]. InvalidArgument for anything else.
torch::Tensor mask_to_gray(const torch::Tensor& mask);

// The user-facing adjustments, before anything else: `invert` (255 - v), then a Gaussian blur
// of `blur` pixels (sigma; 0 = none). uint8 [H, W] -> uint8 [H, W].
torch::Tensor adjust_mask(const torch::Tensor& gray, bool invert, double blur);

// VaeImageProcessor(do_normalize=False, do_binarize=True, do_convert_grayscale=True)
// .preprocess: resized with Pillow's Lanczos to height x width when the size differs (in the
// image's own mode, converted to L after), then L/255 >= 0.5 -> 1, else 0. -> float32
// [1, 1, height, width]. `mask` as mask_to_gray takes it.
torch::Tensor preprocess_mask(const torch::Tensor& mask, int64_t height, int64_t width);

// prepare_mask_latents' mask: nearest-neighbour down to the latent size (torch's 'nearest':
// source index floor(dst * in / out)). [1, 1, H, W] -> [1, 1, H/f, W/f].
torch::Tensor latent_mask(const torch::Tensor& binary_mask, int64_t latent_height,
                          int64_t latent_width);

// InpaintOptions::fill: "original", "fill", "latent_noise" or "latent_nothing"; InvalidArgument
// naming the value otherwise, Unsupported for "fill" in a build without OpenCV.
void validate_inpaint_fill(const std::string& fill);

// A1111's "fill": the repaint region of an 8-bit RGB image ([H, W, 3]) painted from its
// surroundings (OpenCV's Telea inpainting, radius 3 px) before it is encoded, so that a
// strength below 1 does not keep what was there. `binary_mask` [1, 1, H, W], 1 = repaint.
// In pipeline/opencv_image_ops.cpp.
torch::Tensor fill_masked_region(const torch::Tensor& image, const torch::Tensor& binary_mask);

// image [N, 3, H, W] in [-1, 1] with the repaint region set to 0 (diffusers: image * (mask < 0.5)).
torch::Tensor masked_image(const torch::Tensor& image, const torch::Tensor& binary_mask);

// True when the mask repaints nothing / everything (after binarising).
bool mask_is_empty(const torch::Tensor& binary_mask);
bool mask_is_full(const torch::Tensor& binary_mask);

// VaeImageProcessor.get_crop_region: the bounding box of the mask's non-zero pixels, widened
// by `pad`, then grown to the aspect ratio width:height and shifted inside the image.
// `gray` uint8 [H, W]. InvalidArgument when the mask is all black.
CropBox mask_crop_region(const torch::Tensor& gray, int64_t width, int64_t height, int64_t pad);

// image.crop(box) then VaeImageProcessor.resize(..., resize_mode="fill") to height x width:
// aspect-preserving Lanczos resize, centred, the uncovered strips filled from the edges.
// uint8 [H, W, C] -> uint8 [height, width, C].
torch::Tensor crop_and_fill(const torch::Tensor& image, const CropBox& box, int64_t height,
                            int64_t width);

// VaeImageProcessor.apply_overlay: `generated` (uint8 [h, w, 3]) resized ("crop" mode) into
// `box` of a black canvas of the source's size (or the whole canvas without a box), then the
// source composited over it with alpha 255 - mask (the soft mask, not binarised): where the
// mask is black the source shows exactly. `source` uint8 [H, W, 3], `gray_mask` uint8 [H, W].
torch::Tensor apply_overlay(const torch::Tensor& gray_mask, const torch::Tensor& source,
                            const torch::Tensor& generated, const CropBox* box);

// A masked run's inputs at the size it works at, once for every family: the source's mask
// (resized to the source when its size differs, then inverted / blurred as asked), the crop
// box when only the masked area is worked on, the picture the pipeline encodes and its binary
// mask. InvalidArgument when the mask repaints nothing.
struct PreparedInpaint {
  torch::Tensor source;        // uint8 [H0, W0, 3], as given
  torch::Tensor gray;          // uint8 [H0, W0]: the adjusted mask at the source's size
  std::optional<CropBox> box;  // InpaintOptions::crop_padding >= 0
  torch::Tensor image;         // uint8 [height, width, 3]: the (cropped) source, resized
  torch::Tensor mask;          // float32 [1, 1, height, width], 1 = repaint
};
PreparedInpaint prepare_inpaint(const InpaintOptions& options, const torch::Tensor& source,
                                int64_t height, int64_t width);
// The finished picture (uint8 [height, width, 3]) as the user gets it: with a crop box, pasted
// back over the untouched source (apply_overlay); else as generated.
torch::Tensor finish_inpaint(const PreparedInpaint& prepared, const torch::Tensor& generated);
// The same on decoded images [N, H, W, 3] float in [0, 1] (rounded to 8 bits as saved, and
// back): unchanged without a crop box.
torch::Tensor finish_inpaint_images(const PreparedInpaint& prepared, const torch::Tensor& images);

}  // namespace diffuse::pipeline
