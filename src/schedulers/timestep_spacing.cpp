#include "schedulers/timestep_spacing.h"

#include "schedulers/numpy_ops.h"

namespace diffuse::schedulers {

std::vector<double> spaced_timesteps(TimestepSpacing spacing, int64_t num_train_timesteps, int n,
                                     int64_t steps_offset, bool round_linspace) {
  const auto T = static_cast<double>(num_train_timesteps);
  std::vector<double> t;
  switch (spacing) {
    case TimestepSpacing::kLinspace:
      t = np::linspace(0, T - 1, n);
      if (round_linspace) t = np::round(t);
      return np::reversed(t);
    case TimestepSpacing::kLeading: {
      const int64_t ratio = num_train_timesteps / n;
      for (int64_t i = n - 1; i >= 0; --i)
        t.push_back(static_cast<double>(i * ratio + steps_offset));
      return t;
    }
    case TimestepSpacing::kTrailing:
      t = np::round(np::arange(T, 0, -(T / n)));
      for (auto& x : t) x -= 1;
      return t;
  }
  return t;
}

}  // namespace diffuse::schedulers
