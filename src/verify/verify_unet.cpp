// Golden runner for component "unet": UNet2DConditionModel forward on the case's sample,
// timestep and encoder_hidden_states (named x / enc in some sets), with SDXL's text_embeds and
// time_ids when the case has them; compares "out" and every captured "inter.*".
#include <torch/torch.h>

#include "io/model_folder.h"
#include "models/unet2d_condition.h"
#include "nn/layers.h"
#include "verify/compare_intermediates.h"
#include "verify/runners.h"

namespace diffuse::verify {

CaseResult verify_unet(const GoldenSet& set, const GoldenCase& c, const VerifyOptions& options) {
  auto folder = io::ModelFolder::open(set.model_dir());
  auto unet = models::load_unet(folder, options.device, torch::kFloat32);
  if (options.weights) nn::quantize_linear_layers(*unet, *options.weights);
  CaseTensors tensors(c);
  auto input = [&](const char* name, const char* other) {
    return tensors.get(tensors.has(name) ? name : other).to(options.device);
  };
  auto sample = input("sample", "x");
  auto ehs = input("encoder_hidden_states", "enc");
  models::UNetAddedConditions added;
  if (tensors.has("text_embeds")) added.text_embeds = tensors.get("text_embeds");
  if (tensors.has("time_ids")) added.time_ids = tensors.get("time_ids");
  models::Intermediates captured;
  auto out =
      unet->forward(sample, tensors.get("timestep"), ehs, &captured,
                    added.text_embeds.defined() || added.time_ids.defined() ? &added : nullptr);

  return compare_network_outputs(c, tensors, out, captured, options.weights);
}

}  // namespace diffuse::verify
