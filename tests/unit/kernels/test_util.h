#pragma once
// Small helpers for the kernel tests: seeded random tensors and comparisons.
#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "kernels/cpu/linear.h"

namespace moonrun::cpu::testing {

class Rng {
 public:
  explicit Rng(unsigned seed) : gen_(seed) {}
  float uniform(float lo, float hi) { return std::uniform_real_distribution<float>(lo, hi)(gen_); }
  std::vector<float> vec(size_t n, float lo, float hi) {
    std::vector<float> v(n);
    for (float& x : v) x = uniform(lo, hi);
    return v;
  }
  // A Linear with entries uniform in +-1/sqrt(in) (nn.Linear's default range) times gain.
  Linear linear(int out, int in, float gain = 1.0f) {
    Linear l;
    l.out_features = out;
    l.in_features = in;
    const float b = gain / std::sqrt(static_cast<float>(in));
    l.w = vec(static_cast<size_t>(out) * in, -b, b);
    return l;
  }

 private:
  std::mt19937 gen_;
};

inline double max_abs(const std::vector<float>& a) {
  double m = 0;
  for (float x : a) m = std::max(m, std::fabs(static_cast<double>(x)));
  return m;
}

template <typename A, typename B>
double max_abs_diff(const A& a, const B& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i)
    m = std::max(m, std::fabs(static_cast<double>(a[i]) - static_cast<double>(b[i])));
  return m;
}

// y = x W^T in double, plain loops (the tests' own projection, independent of matmul_xwT).
inline std::vector<double> linear_f64(const Linear& l, const std::vector<double>& x, int n) {
  std::vector<double> y(static_cast<size_t>(n) * l.out_features);
  for (int t = 0; t < n; ++t)
    for (int o = 0; o < l.out_features; ++o) {
      double s = 0;
      for (int i = 0; i < l.in_features; ++i)
        s += x[static_cast<size_t>(t) * l.in_features + i] *
             static_cast<double>(l.w[static_cast<size_t>(o) * l.in_features + i]);
      y[static_cast<size_t>(t) * l.out_features + o] = s;
    }
  return y;
}

inline double sigmoid_f64(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// RMSNorm of one row: w * x / sqrt(mean(x^2) + eps).
inline void rmsnorm_f64(double* x, int n, const std::vector<float>& w, double eps) {
  double ss = 0;
  for (int i = 0; i < n; ++i) ss += x[i] * x[i];
  const double inv = 1.0 / std::sqrt(ss / n + eps);
  for (int i = 0; i < n; ++i) x[i] = x[i] * inv * w[i];
}

}  // namespace moonrun::cpu::testing
