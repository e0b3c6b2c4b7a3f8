#include "pipeline/finite_check.h"

#include <torch/torch.h>

#include "device/device.h"
#include "diffuse/errors.h"

namespace diffuse::pipeline {

void check_stage_finite(const torch::Tensor& values, const std::string& stage,
                        const torch::Device& device, torch::Dtype dtype) {
  if (!values.defined() || !values.is_floating_point()) return;
  if (torch::isfinite(values).all().item<bool>()) return;
  const bool any_nan = torch::isnan(values).any().item<bool>();
  std::string cause;
  if (dtype == torch::kFloat16)
    cause =
        "fp16 overflows easily (activations beyond 65504): run in bf16 or fp32 (--dtype, and "
        "--vae-dtype fp32 for the VAE)";
  else
    cause =
        "check the model's weights and config, the guidance scale, and any latents or noise "
        "given as input";
  throw NumericalError("the " + stage + " stage produced " + (any_nan ? "NaN" : "infinite") +
                       " values on " + device::device_name(device) + " in " +
                       device::dtype_name(dtype) + "; likely cause: " + cause);
}

void check_input_tensor(const torch::Tensor& values, const std::string& what) {
  if (!values.is_floating_point())
    throw InvalidArgument(what + ": expected floating-point values, got " +
                          std::string(c10::toString(values.scalar_type())));
  if (!torch::isfinite(values).all().item<bool>())
    throw InvalidArgument(what + ": contains NaN or infinite values");
}

}  // namespace diffuse::pipeline
