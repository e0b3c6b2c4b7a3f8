#include "schedulers/numpy_ops.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace diffuse::schedulers::np {

std::vector<double> linspace(double start, double stop, int64_t num) {
  std::vector<double> y(static_cast<size_t>(std::max<int64_t>(num, 0)));
  if (num <= 0) return y;
  const int64_t div = num - 1;
  const double delta = stop - start;
  if (div > 0) {
    const double step = delta / static_cast<double>(div);
    for (int64_t i = 0; i < num; ++i) {
      // numpy: if step == 0, y = (i / div) * delta, else y = i * step; then y += start.
      double v = step == 0 ? (static_cast<double>(i) / static_cast<double>(div)) * delta
                           : static_cast<double>(i) * step;
      y[static_cast<size_t>(i)] = v + start;
    }
    y.back() = stop;
  } else {
    y[0] = 0.0 * delta + start;
  }
  return y;
}

std::vector<double> arange(double start, double stop, double step) {
  // numpy: length = ceil((stop - start) / step); buffer[0] = start, buffer[1] = start + step,
  // then buffer[i] = start + i * (buffer[1] - buffer[0]).
  double len_f = std::ceil((stop - start) / step);
  if (!(len_f > 0)) return {};
  auto len = static_cast<size_t>(len_f);
  std::vector<double> v(len);
  v[0] = start;
  if (len == 1) return v;
  v[1] = start + step;
  const double delta = v[1] - v[0];
  for (size_t i = 2; i < len; ++i) v[i] = start + static_cast<double>(i) * delta;
  return v;
}

double round(double x) {
  return std::nearbyint(x);
}

std::vector<double> round(std::vector<double> v) {
  for (auto& x : v) x = std::nearbyint(x);
  return v;
}

std::vector<double> reversed(std::vector<double> v) {
  std::reverse(v.begin(), v.end());
  return v;
}

std::vector<double> interp_on_index_grid(const std::vector<double>& x,
                                         const std::vector<double>& fp) {
  // numpy's arr_interp with xp = 0, 1, ..., n-1: clamps outside, exact at grid points, else
  // slope * (x - xp[j]) + fp[j].
  const auto n = static_cast<int64_t>(fp.size());
  std::vector<double> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double xv = x[i];
    if (std::isnan(xv)) {
      out[i] = xv;
    } else if (xv <= 0) {
      out[i] = fp[0];
    } else if (xv >= static_cast<double>(n - 1)) {
      out[i] = fp[static_cast<size_t>(n - 1)];
    } else {
      auto j = static_cast<int64_t>(std::floor(xv));
      const auto dj = static_cast<double>(j);
      if (dj == xv) {
        out[i] = fp[static_cast<size_t>(j)];
      } else {
        const double slope = (fp[static_cast<size_t>(j + 1)] - fp[static_cast<size_t>(j)]) /
                             (static_cast<double>(j + 1) - dj);
        out[i] = slope * (xv - dj) + fp[static_cast<size_t>(j)];
      }
    }
  }
  return out;
}

std::vector<double> karras_sigmas(double sigma_min, double sigma_max, int64_t num) {
  const double rho = 7.0;
  const double min_inv_rho = std::pow(sigma_min, 1 / rho);
  const double max_inv_rho = std::pow(sigma_max, 1 / rho);
  std::vector<double> ramp = linspace(0, 1, num);
  std::vector<double> sigmas(ramp.size());
  for (size_t i = 0; i < ramp.size(); ++i)
    sigmas[i] = std::pow(max_inv_rho + ramp[i] * (min_inv_rho - max_inv_rho), rho);
  return sigmas;
}

double sigma_to_t(double sigma, const std::vector<double>& log_sigmas) {
  const double log_sigma = std::log(std::max(sigma, 1e-10));
  const auto n = static_cast<int64_t>(log_sigmas.size());
  // argmax of cumsum(dists >= 0): the last index with log_sigmas[i] <= log_sigma, or 0.
  int64_t low = 0;
  int64_t count = 0, best = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (log_sigma - log_sigmas[static_cast<size_t>(i)] >= 0) ++count;
    if (count > best) {
      best = count;
      low = i;
    }
  }
  low = std::min(low, n - 2);
  const int64_t high = low + 1;
  const double lo = log_sigmas[static_cast<size_t>(low)];
  const double hi = log_sigmas[static_cast<size_t>(high)];
  double w = (lo - log_sigma) / (lo - hi);
  w = std::min(std::max(w, 0.0), 1.0);
  return (1 - w) * static_cast<double>(low) + w * static_cast<double>(high);
}

}  // namespace diffuse::schedulers::np
