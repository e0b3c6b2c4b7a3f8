// SDXL's ensemble of expert denoisers (base -> refiner): the part of a schedule one run
// covers, cut as diffusers' denoising_start / denoising_end cut it.
#pragma once
#include <torch/types.h>

#include <cstdint>

namespace diffuse::pipeline {

struct StepRange {
  int64_t begin = 0, end = 0;  // [begin, end) into the timesteps
};

// `timesteps` (descending, as a scheduler gives them) from `begin` on. start > 0: the steps
// whose t < round(T - start * T) (T = num_train_timesteps), one more for a second-order
// scheduler when their count is even (diffusers' img2img get_timesteps). end < 1: of those, the
// ones whose t >= round(T - end * T). Python's round (half to even) is matched.
StepRange denoising_range(const torch::Tensor& timesteps, int64_t num_train_timesteps, int order,
                          double start, double end, int64_t begin = 0);

}  // namespace diffuse::pipeline
