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
  if (options.weights) {
    nn::quantize_linear_layers(*unet, *options.weights);
    nn::quantize_conv_layers(*unet, *options.weights);
  }
  CaseTensors tensors(c);
  auto input = [&](const char* name, const char* other) {
    return tensors.get(tensors.has(name) ? name : other).to(options.device);
  };
  auto sample = input("sample", "x");
  auto ehs = input("encoder_hidden_states", "enc");
  models::UNetAddedConditions added;
  if (tensors.has("text_embeds")) added.text_embeds = tensors.get("text_embeds");
  if (tensors.has("time_ids")) added.time_ids = tensors.get("time_ids");
  // ControlNet residuals the UNet adds to its skips (down_block_additional_residual.i).
  models::UNetControlResiduals control;
  for (size_t i = 0; tensors.has("down_block_additional_residual." + std::to_string(i)); ++i)
    control.down.push_back(
        tensors.get("down_block_additional_residual." + std::to_string(i)).to(options.device));
  if (tensors.has("mid_block_additional_residual"))
    control.mid = tensors.get("mid_block_additional_residual").to(options.device);
  const bool controlled = !control.down.empty() || control.mid.defined();
  const auto* add = added.text_embeds.defined() || added.time_ids.defined() ? &added : nullptr;
  models::Intermediates captured;
  auto out = unet->forward(sample, tensors.get("timestep"), ehs, &captured, add,
                           controlled ? &control : nullptr);
  auto r = compare_network_outputs(c, tensors, out, captured, options.weights);
  if (controlled && tensors.has("out_without_control")) {
    const auto plain = unet->forward(sample, tensors.get("timestep"), ehs, nullptr, add);
    r.add("out_without_control",
          compare("out_without_control", plain.cpu(), tensors.get("out_without_control"),
                  c.tol("atol", 1e-4), c.tol("rtol", 0.0)));
  }
  return r;
}

}  // namespace diffuse::verify
