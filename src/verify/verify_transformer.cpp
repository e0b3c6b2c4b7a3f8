// Golden runner for component "transformer" (FLUX transformers go to verify_flux_transformer):
// HiDreamImageTransformer2DModel forward on the
// case's x, timesteps, t5, llama and pooled (params.max_seq overrides the config's, as
// HiDream-E1 does; params.component picks another folder, default "transformer"); compares
// "out" and every captured "inter.*".
#include <torch/torch.h>

#include "io/model_folder.h"
#include "models/hidream_transformer.h"
#include "verify/compare_intermediates.h"
#include "verify/runners.h"

namespace diffuse::verify {

CaseResult verify_transformer(const GoldenSet& set, const GoldenCase& c,
                              const VerifyOptions& options) {
  const auto [dir, component] =
      case_component(set, c, "model", c.param("component", std::string("transformer")));
  auto folder = io::ModelFolder::open(dir);
  if (folder.component_config(component, "config.json").get<std::string>("_class_name", "") ==
      "FluxTransformer2DModel")
    return verify_flux_transformer(set, c, options);
  auto model = models::load_hidream_transformer(folder, options.device, torch::kFloat32, component,
                                                /*stream=*/false, options.weights);
  CaseTensors tensors(c);
  models::HiDreamForwardOptions fwd;
  fwd.max_seq = c.param("max_seq", int64_t{0});
  models::Intermediates captured;
  auto out = model->forward(tensors.get("x").to(options.device), tensors.get("timesteps"),
                            tensors.get("t5"), tensors.get("llama"), tensors.get("pooled"), fwd,
                            &captured);
  return compare_network_outputs(c, tensors, out, captured, options.weights);
}

}  // namespace diffuse::verify
