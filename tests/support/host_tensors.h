#pragma once
// Test helpers shared by the backend, model and CUDA op tests: seeded random host tensors,
// float64 reference pieces (plain loops, independent of the kernels under test), and the
// moves between host vectors and a backend's tensors.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "backend/ops.h"
#include "common/dtype.h"

namespace moonrun::testing {

// A dense [out, in] weight on the host (nn.Linear convention).
struct HostMatrix {
  std::vector<float> w;
  int out = 0;
  int in = 0;
  bool empty() const { return w.empty(); }
};

class Rng {
 public:
  explicit Rng(unsigned seed) : gen_(seed) {}
  float uniform(float lo, float hi) { return std::uniform_real_distribution<float>(lo, hi)(gen_); }
  std::vector<float> vec(size_t n, float lo, float hi) {
    std::vector<float> v(n);
    for (float& x : v) x = uniform(lo, hi);
    return v;
  }
  // Entries uniform in +-1/sqrt(in) (nn.Linear's default range) times gain.
  HostMatrix matrix(int out, int in, float gain = 1.0f) {
    const float b = gain / std::sqrt(static_cast<float>(in));
    return HostMatrix{vec(static_cast<size_t>(out) * in, -b, b), out, in};
  }
  uint32_t bits() { return gen_(); }

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
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = std::fabs(static_cast<double>(a[i]) - static_cast<double>(b[i]));
    if (!(d <= m)) m = d;  // NaN wins
  }
  return m;
}

// y = x W^T in double, plain loops.
inline std::vector<double> linear_f64(const HostMatrix& l, const std::vector<double>& x, int n) {
  std::vector<double> y(static_cast<size_t>(n) * l.out);
  for (int t = 0; t < n; ++t)
    for (int o = 0; o < l.out; ++o) {
      double s = 0;
      for (int i = 0; i < l.in; ++i)
        s += x[static_cast<size_t>(t) * l.in + i] * static_cast<double>(l.w[static_cast<size_t>(o) * l.in + i]);
      y[static_cast<size_t>(t) * l.out + o] = s;
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

// ---- host <-> backend -------------------------------------------------------------------

// Host floats into a new backend tensor of `dtype` [rows, cols] (BF16 and F8_E4M3 round to
// nearest even).
inline Tensor upload(Ops& ops, const std::vector<float>& v, int64_t rows, int64_t cols, DType dtype = DType::F32) {
  Tensor t = ops.alloc(rows, cols, dtype, "test");
  if (dtype == DType::F32) {
    ops.upload(t, 0, v.data(), v.size() * sizeof(float));
  } else if (dtype == DType::F8_E4M3) {
    std::vector<uint8_t> h(v.size());
    for (size_t i = 0; i < v.size(); ++i) h[i] = f32_to_f8e4m3(v[i]);
    ops.upload(t, 0, h.data(), h.size());
  } else {
    std::vector<uint16_t> h(v.size());
    for (size_t i = 0; i < v.size(); ++i) h[i] = f32_to_bf16(v[i]);
    ops.upload(t, 0, h.data(), h.size() * sizeof(uint16_t));
  }
  return t;
}
inline Matrix upload_matrix(Ops& ops, const HostMatrix& m) {
  if (m.empty()) return {};
  Matrix out;
  out.w = upload(ops, m.w, m.out, m.in, ops.weight_dtype());
  out.out = m.out;
  out.in = m.in;
  return out;
}
// A backend tensor (F32, BF16, F8_E4M3 or I32) back to host floats.
inline std::vector<float> download(Ops& ops, const Tensor& t) {
  std::vector<float> out(static_cast<size_t>(t.numel()));
  if (t.dtype == DType::F32) {
    ops.download(t, out.data());
  } else if (t.dtype == DType::F8_E4M3) {
    std::vector<uint8_t> h(out.size());
    ops.download(t, h.data());
    for (size_t i = 0; i < h.size(); ++i) out[i] = f8e4m3_to_f32(h[i]);
  } else if (t.dtype == DType::BF16) {
    std::vector<uint16_t> h(out.size());
    ops.download(t, h.data());
    for (size_t i = 0; i < h.size(); ++i) out[i] = bf16_to_f32(h[i]);
  } else {
    std::vector<int32_t> h(out.size());
    ops.download(t, h.data());
    for (size_t i = 0; i < h.size(); ++i) out[i] = static_cast<float>(h[i]);
  }
  return out;
}

}  // namespace moonrun::testing
