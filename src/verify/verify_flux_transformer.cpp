// Golden runner for FluxTransformer2DModel (component "transformer" whose config names that
// class): forward on the case's packed x, timestep, enc, pooled, img_ids, txt_ids and, for
// models with guidance_embeds, guidance; compares "out" and every captured "inter.*".
// params.model names the transformer folder relative to the set (default: the model's
// transformer/).
#include <torch/torch.h>

#include <filesystem>

#include "io/model_folder.h"
#include "models/flux_transformer.h"
#include "verify/compare_intermediates.h"
#include "verify/runners.h"

namespace diffuse::verify {

std::pair<std::string, std::string> case_component(const GoldenSet& set, const GoldenCase& c,
                                                   const std::string& key,
                                                   const std::string& fallback) {
  if (!c.params.contains(key)) return {set.model_dir(c), fallback};
  const std::filesystem::path dir =
      set.path_inside(c.param(key, std::string()), c.where + " params." + key);
  return {dir.parent_path().string(), dir.filename().string()};
}

CaseResult verify_flux_transformer(const GoldenSet& set, const GoldenCase& c,
                                   const VerifyOptions& options) {
  const auto [dir, component] = case_component(set, c, "model", "transformer");
  auto model = models::load_flux_transformer(io::ModelFolder::open(dir), options.device,
                                             torch::kFloat32, component, options.weights);
  CaseTensors tensors(c);
  models::Intermediates captured;
  const auto guidance = model->config().guidance_embeds ? tensors.get("guidance") : torch::Tensor();
  auto out = model->forward(tensors.get("x"), tensors.get("timestep"), tensors.get("enc"),
                            tensors.get("pooled"), tensors.get("img_ids"), tensors.get("txt_ids"),
                            guidance, {}, &captured);
  return compare_network_outputs(c, tensors, out, captured, options.weights);
}

}  // namespace diffuse::verify
