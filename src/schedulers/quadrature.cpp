#include "schedulers/quadrature.h"

#include <algorithm>
#include <cmath>

namespace diffuse::schedulers {
namespace {

// 7-point Gauss-Legendre nodes and weights on [-1, 1].
constexpr double kNodes[7] = {0.0,
                              0.4058451513773971669066064,
                              -0.4058451513773971669066064,
                              0.7415311855993944398638648,
                              -0.7415311855993944398638648,
                              0.9491079123427585245261897,
                              -0.9491079123427585245261897};
constexpr double kWeights[7] = {0.4179591836734693877551020, 0.3818300505051189449503698,
                                0.3818300505051189449503698, 0.2797053914892766679014678,
                                0.2797053914892766679014678, 0.1294849661688696932706114,
                                0.1294849661688696932706114};

double gauss7(const std::function<double(double)>& f, double a, double b) {
  const double center = 0.5 * (a + b);
  const double half = 0.5 * (b - a);
  double sum = 0;
  for (int i = 0; i < 7; ++i) sum += kWeights[i] * f(center + half * kNodes[i]);
  return sum * half;
}

double adapt(const std::function<double(double)>& f, double a, double b, double whole,
             double tolerance, int depth) {
  const double mid = 0.5 * (a + b);
  const double left = gauss7(f, a, mid);
  const double right = gauss7(f, mid, b);
  const double halves = left + right;
  if (depth <= 0 || std::abs(halves - whole) <= tolerance * std::max(1.0, std::abs(halves)))
    return halves;
  return adapt(f, a, mid, left, tolerance / 2, depth - 1) +
         adapt(f, mid, b, right, tolerance / 2, depth - 1);
}

}  // namespace

double integrate(const std::function<double(double)>& f, double a, double b, double tolerance) {
  if (a == b) return 0.0;
  return adapt(f, a, b, gauss7(f, a, b), tolerance, 30);
}

}  // namespace diffuse::schedulers
