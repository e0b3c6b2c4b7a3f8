// Options shared by the Stable Diffusion pipeline test suites.
#pragma once
#include "diffuse/pipeline.h"

namespace diffuse::test {

// CPU, float32 for every network: the setting the golden comparisons use.
inline LoadOptions fp32_cpu() {
  LoadOptions o;
  o.device = "cpu";
  o.dtype = "fp32";
  o.vae_dtype = "fp32";
  return o;
}

}  // namespace diffuse::test
