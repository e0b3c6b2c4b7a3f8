// Golden runner for component "unet": UNet2DConditionModel forward on the case's sample,
// timestep and encoder_hidden_states; compares "out" and every captured "inter.*".
#include <torch/torch.h>

#include "io/model_folder.h"
#include "models/unet2d_condition.h"
#include "verify/compare_intermediates.h"
#include "verify/runners.h"

namespace diffuse::verify {

CaseResult verify_unet(const GoldenSet& set, const GoldenCase& c, const VerifyOptions& options) {
  auto folder = io::ModelFolder::open(set.model_dir());
  auto unet = models::load_unet(folder, options.device, torch::kFloat32);
  CaseTensors tensors(c);
  auto sample = tensors.get("sample").to(options.device);
  auto ehs = tensors.get("encoder_hidden_states").to(options.device);
  models::Intermediates captured;
  auto out = unet->forward(sample, tensors.get("timestep"), ehs, &captured);

  const double atol = c.tol("atol", 1e-4), rtol = c.tol("rtol", 0.0);
  CaseResult result;
  result.add("out", compare("out", out, tensors.get("out"), atol, rtol));
  compare_intermediates(result, tensors, captured, atol, rtol);
  return result;
}

}  // namespace diffuse::verify
