// The few numpy operations diffusers uses to build schedules, reproduced with numpy's exact
// float64 arithmetic (same formulas, same rounding), so timesteps and sigmas come out
// bit-identical: linspace, float arange (including its length rule and fill recurrence),
// round-half-to-even, interp, and the Karras / sigma->t helpers shared by several schedulers.
#pragma once
#include <cstdint>
#include <vector>

namespace diffuse::schedulers::np {

// numpy.linspace(start, stop, num) in float64 (endpoint included).
std::vector<double> linspace(double start, double stop, int64_t num);
// numpy.arange(start, stop, step) in float64.
std::vector<double> arange(double start, double stop, double step);
// numpy.round / rint: round half to even.
double round(double x);
std::vector<double> round(std::vector<double> v);
std::vector<double> reversed(std::vector<double> v);
// numpy.interp(x, arange(len(fp)), fp) for sample points on the integer grid 0..len(fp)-1.
std::vector<double> interp_on_index_grid(const std::vector<double>& x,
                                         const std::vector<double>& fp);

// Karras et al. (2022) noise levels: (max^(1/rho) + ramp * (min^(1/rho) - max^(1/rho)))^rho
// with ramp = linspace(0, 1, num), rho = 7.
std::vector<double> karras_sigmas(double sigma_min, double sigma_max, int64_t num);
// diffusers' _sigma_to_t: the fractional training timestep of `sigma`, by linear
// interpolation in log-sigma. `log_sigmas` ascending (index = training timestep).
double sigma_to_t(double sigma, const std::vector<double>& log_sigmas);

}  // namespace diffuse::schedulers::np
