// Golden runner for component "preprocessing": the inpainting pipelines' mask processing
// (inputs image_u8, mask_u8, posterior_noise_masked_image: the resized image and mask, the
// binary mask, the masked image, the latent mask and the masked image's latents, repeated
// to params.batch_size and doubled for guidance as prepare_mask_latents does) or a ControlNet's
// control image (input image_u8 alone: control_image, and control_image_from_float from
// image_u8 / 255 as a float array). 8-bit and binary results compare exactly.
#include <torch/torch.h>

#include "io/model_folder.h"
#include "io/pillow_resample.h"
#include "models/autoencoder_kl.h"
#include "pipeline/control_image.h"
#include "pipeline/inpaint_mask.h"
#include "verify/compare_intermediates.h"
#include "verify/runners.h"

namespace diffuse::verify {
namespace {

CaseResult verify_mask_processing(const GoldenSet& set, const GoldenCase& c,
                                  const VerifyOptions& o) {
  CaseTensors t(c);
  CaseResult r;
  const int64_t height = c.param("height", int64_t{0}), width = c.param("width", int64_t{0});
  const auto image_u8 = t.get("image_u8"), mask_u8 = t.get("mask_u8");
  const auto exact = [&](const std::string& name, const torch::Tensor& got) {
    if (t.has(name)) r.add(name, compare_exact(name, got, t.get(name)));
  };
  const auto resized = image_u8.size(0) == height && image_u8.size(1) == width
                           ? image_u8
                           : io::pillow_lanczos_resize(image_u8, height, width);
  exact("inter.image_resized_u8", resized);
  if (mask_u8.dim() == 3) {
    const auto mask_resized = mask_u8.size(0) == height && mask_u8.size(1) == width
                                  ? mask_u8
                                  : io::pillow_lanczos_resize(mask_u8, height, width);
    exact("inter.mask_resized_rgb_u8", mask_resized);
    exact("inter.mask_gray_u8", pipeline::mask_to_gray(mask_resized));
  }
  const auto image = resized.to(torch::kFloat32).div(255).permute({2, 0, 1}).unsqueeze(0) * 2 - 1;
  exact("image_preprocessed", image.contiguous());
  const auto mask = pipeline::preprocess_mask(mask_u8, height, width);
  exact("mask_preprocessed", mask);
  const auto masked = pipeline::masked_image(image, mask);
  exact("masked_image", masked);

  auto vae = models::load_vae(io::ModelFolder::open(set.model_dir(c)), o.device, torch::kFloat32);
  const auto& vc = vae->config();
  const int64_t f = vc.spatial_factor();
  const int64_t batch = c.param("batch_size", int64_t{1});
  const bool cfg = c.param("do_classifier_free_guidance", false);
  const auto repeat = [&](const torch::Tensor& x) {
    auto y = x.repeat({batch, 1, 1, 1});
    return cfg ? torch::cat({y, y}) : y;
  };
  exact("mask_latent", repeat(pipeline::latent_mask(mask, height / f, width / f)));
  const double atol = c.tol("atol", 1e-4);
  auto dist = vae->encode(masked.to(o.device));
  if (t.has("inter.posterior_mean"))
    r.add("inter.posterior_mean",
          compare("inter.posterior_mean", dist.mean.cpu(), t.get("inter.posterior_mean"), atol, 0));
  if (t.has("inter.posterior_std"))
    r.add("inter.posterior_std",
          compare("inter.posterior_std", dist.std.cpu(), t.get("inter.posterior_std"), atol, 0));
  const auto latents = vc.to_latents(
      dist.mean + dist.std * t.get("posterior_noise_masked_image").to(dist.mean.device()));
  if (t.has("masked_image_latents"))
    r.add("masked_image_latents", compare("masked_image_latents", repeat(latents).cpu(),
                                          t.get("masked_image_latents"), atol, 0));
  return r;
}

CaseResult verify_control_image(const GoldenCase& c) {
  CaseTensors t(c);
  CaseResult r;
  const int64_t height = c.param("height", int64_t{0}), width = c.param("width", int64_t{0});
  const auto image_u8 = t.get("image_u8");
  if (t.has("inter.resized_u8"))
    r.add("inter.resized_u8",
          compare_exact("inter.resized_u8", io::pillow_lanczos_resize(image_u8, height, width),
                        t.get("inter.resized_u8")));
  r.add("control_image",
        compare_exact("control_image", pipeline::preprocess_control_image(image_u8, height, width),
                      t.get("control_image")));
  if (t.has("control_image_from_float"))
    r.add("control_image_from_float",
          compare_exact("control_image_from_float",
                        pipeline::preprocess_control_image(
                            (image_u8.to(torch::kFloat32) / 255).unsqueeze(0), height, width),
                        t.get("control_image_from_float")));
  return r;
}

}  // namespace

CaseResult verify_preprocessing(const GoldenSet& set, const GoldenCase& c,
                                const VerifyOptions& options) {
  CaseTensors t(c);
  if (t.has("mask_u8")) return verify_mask_processing(set, c, options);
  if (t.has("image_u8")) return verify_control_image(c);
  throw FormatError(c.file + ": a preprocessing case needs image_u8 (and mask_u8 for a mask)");
}

}  // namespace diffuse::verify
