// Adaptive numerical integration, used by the LMS scheduler for its multistep coefficients
// (diffusers integrates them with scipy.integrate.quad).
#pragma once
#include <functional>

namespace diffuse::schedulers {

// Integral of f over [a, b] (a > b gives the negated integral) by adaptive 7-point
// Gauss-Legendre: an interval is accepted when its estimate agrees with the sum over its two
// halves to within `tolerance` (absolute, scaled by max(1, |estimate|)). Exact for
// polynomials up to degree 13 on the first pass.
double integrate(const std::function<double(double)>& f, double a, double b,
                 double tolerance = 1e-12);

}  // namespace diffuse::schedulers
