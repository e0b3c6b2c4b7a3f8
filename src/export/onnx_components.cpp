#include "export/onnx_components.h"

#include <torch/torch.h>

#include "diffuse/errors.h"
#include "io/model_folder.h"
#include "models/autoencoder_kl.h"
#include "models/unet2d_condition.h"

namespace diffuse::onnx_export {
namespace {

void check_size(int64_t value, int64_t factor, const std::string& flag) {
  if (value < factor || value > kMaxPixels || value % factor != 0)
    throw InvalidArgument(flag + " " + std::to_string(value) + ": must be a multiple of " +
                          std::to_string(factor) + " between " + std::to_string(factor) + " and " +
                          std::to_string(kMaxPixels) +
                          " (the VAE's factor; the ONNX graph has static sizes)");
}

}  // namespace

TensorSpec spec(const std::string& name, torch::Dtype dtype, const std::vector<Dim>& dims) {
  TensorSpec t{name, dtype, {}};
  for (const auto& d : dims) {
    const auto* n = std::get_if<int64_t>(&d);
    t.dims.push_back(n ? *n : -1);
  }
  return t;
}

void check_all_exported(const torch::nn::Module& module, const OnnxGraph& g,
                        const std::string& prefix, const std::string& what) {
  std::vector<std::string> missing;
  for (const auto& p : module.named_parameters(true)) {
    const auto name = prefix + p.key();
    if (!g.has_weight(name)) missing.push_back(name);
  }
  if (!missing.empty())
    throw Error("ONNX export of " + what + ": " + std::to_string(missing.size()) +
                " parameters are not in the graph (first: " + missing.front() + ")");
}

std::pair<int64_t, int64_t> image_size(const ExportRequest& r, const io::ModelFolder& folder,
                                       int64_t factor) {
  int64_t h = r.height, w = r.width;
  if ((h == 0 || w == 0) && folder.has_component("unet")) {
    const auto cfg = models::UNet2DConditionConfig::from_json(folder.component_config("unet"));
    if (!cfg.sample_size.empty()) {
      if (h == 0) h = cfg.sample_size.front() * factor;
      if (w == 0) w = cfg.sample_size.back() * factor;
    }
  }
  // DiT folders (no UNet) default to their families' 1024.
  const int64_t fallback = folder.has_component("unet") ? 512 : 1024;
  if (h == 0) h = fallback;
  if (w == 0) w = fallback;
  check_size(h, factor, "--height");
  check_size(w, factor, "--width");
  return {h, w};
}

int64_t vae_factor(const io::ModelFolder& folder) {
  if (!folder.has_component("vae")) return 8;
  return models::AutoencoderKLConfig::from_json(folder.component_config("vae")).spatial_factor();
}

}  // namespace diffuse::onnx_export
