#pragma once
// The CPU backend's dense building blocks, float32 throughout. These are the reference
// ("executable specification") the CUDA kernels are tested against: plain loops, clear
// accumulation order, threads only where they are free.
#include <cstdint>
#include <vector>

namespace moonrun::cpu {

// A dense projection in nn.Linear convention: y = x W^T, W row-major [out, in].
struct Linear {
  std::vector<float> w;  // [out_features, in_features]
  int out_features = 0;
  int in_features = 0;
  bool empty() const { return w.empty(); }
};

// y[t, o] = sum_i x[t, i] * w[o, i]   x: [n_tokens, in], y: [n_tokens, out]
void matmul_xwT(const float* x, int n_tokens, int in_features, const float* w, int out_features,
                float* y);
inline void apply(const Linear& lin, const float* x, int n_tokens, float* y) {
  matmul_xwT(x, n_tokens, lin.in_features, lin.w.data(), lin.out_features, y);
}

// RMSNorm over the last dim of [n_rows, dim]: y = w * (x / sqrt(mean(x^2) + eps)).
// (Reference order: normalise in fp32, then multiply by the weight.)
void rmsnorm(const float* x, int n_rows, int dim, const float* weight, float eps, float* y);

inline float sigmoid(float x) { return 1.0f / (1.0f + __builtin_expf(-x)); }
float softplus(float x);  // log(1 + e^x), torch's threshold-20 form

// Number of worker threads the CPU backend uses (MOONRUN_CPU_THREADS, default: all cores).
int cpu_threads();

}  // namespace moonrun::cpu
