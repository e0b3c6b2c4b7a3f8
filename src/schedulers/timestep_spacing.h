// The timestep spacings shared by DDIM, Euler, Euler ancestral and LMS ("linspace", "leading",
// "trailing"; see Table 2 of arXiv:2305.08891), computed with numpy's float64 arithmetic as
// diffusers does. PNDM and DPM-Solver have their own variants in their files.
#pragma once
#include <cstdint>
#include <vector>

#include "schedulers/scheduler_config.h"

namespace diffuse::schedulers {

// Descending timesteps, float64:
//   linspace: linspace(0, T-1, n) reversed (rounded half-to-even if `round_linspace`)
//   leading:  arange(n) * (T // n) reversed, + steps_offset
//   trailing: round(arange(T, 0, -T/n)) - 1
std::vector<double> spaced_timesteps(TimestepSpacing spacing, int64_t num_train_timesteps, int n,
                                     int64_t steps_offset, bool round_linspace);

}  // namespace diffuse::schedulers
