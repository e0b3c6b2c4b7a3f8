// The public Text2Image / Image2Image classes: thin handles on the shared engine.
#include <torch/torch.h>

#include "diffuse/pipeline.h"
#include "pipeline/stable_diffusion.h"
#include "schedulers/scheduler.h"

namespace diffuse {
namespace {

// [1, 3, H, W] float in [0, 1], resized to (width, height) when given, else to the image's
// own size rounded down to a multiple of the VAE's scale factor `f` (as diffusers'
// VaeImageProcessor does).
torch::Tensor image_to_tensor(const Image& image, int width, int height, int f) {
  if (image.empty() || image.rgb.size() != static_cast<size_t>(image.width) * image.height * 3)
    throw InvalidArgument("init image is empty or its pixel buffer does not match its size");
  auto t = torch::from_blob(const_cast<uint8_t*>(image.rgb.data()),
                            {1, image.height, image.width, 3}, torch::kUInt8)
               .permute({0, 3, 1, 2})
               .to(torch::kFloat32)
               .div(255.0);
  int w = width ? width : image.width / f * f;
  int h = height ? height : image.height / f * f;
  if (w < f || h < f)
    throw InvalidArgument("init image is smaller than " + std::to_string(f) + "x" +
                          std::to_string(f) + " pixels (the VAE's scale factor)");
  if (w != image.width || h != image.height) {
    namespace F = torch::nn::functional;
    t = F::interpolate(t, F::InterpolateFuncOptions()
                              .size(std::vector<int64_t>{h, w})
                              .mode(torch::kBicubic)
                              .align_corners(false))
            .clamp(0, 1);
  }
  return t;
}

}  // namespace

Text2Image Text2Image::load(const std::string& path, const LoadOptions& options) {
  Text2Image p;
  p.impl_ = std::make_shared<pipeline::StableDiffusion>(path, options);
  return p;
}

GenerationResult Text2Image::generate(const GenerationConfig& config, const StepCallback& on_step) {
  auto r = impl_->text2image(config, on_step);
  r.timings.load_s = impl_->info().load_s;
  return r;
}

const PipelineInfo& Text2Image::info() const {
  return impl_->info();
}

Image2Image Image2Image::load(const std::string& path, const LoadOptions& options) {
  Image2Image p;
  p.impl_ = std::make_shared<pipeline::StableDiffusion>(path, options);
  return p;
}

Image2Image Image2Image::sharing(const Text2Image& loaded) {
  Image2Image p;
  p.impl_ = loaded.impl();
  return p;
}

GenerationResult Image2Image::generate(const GenerationConfig& config, const Image& init_image,
                                       const StepCallback& on_step) {
  const int f = impl_->vae_scale_factor();
  pipeline::validate_generation_config(config, true, f);
  // Continuing another run (denoising_start) starts from its latents, not from an image.
  const bool from_latents = config.denoising_start > 0 && init_image.empty();
  // Inpainting resizes or crops the source itself (Pillow's Lanczos, as diffusers): it takes
  // the image as it is.
  const bool masked = config.inpaint.mask.defined() && !init_image.empty();
  auto r = impl_->image2image(
      config,
      from_latents ? torch::Tensor()
      : masked     ? image_to_tensor(init_image, init_image.width, init_image.height, f)
                   : image_to_tensor(init_image, config.width, config.height, f),
      on_step);
  r.timings.load_s = impl_->info().load_s;
  return r;
}

const PipelineInfo& Image2Image::info() const {
  return impl_->info();
}

std::vector<std::string> scheduler_names() {
  return schedulers::scheduler_names();
}

}  // namespace diffuse
