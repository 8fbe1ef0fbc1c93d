#pragma once
// The CPU backend's dense building blocks, float32 throughout. These are the reference
// ("executable specification") the CUDA kernels are tested against: plain loops, clear
// accumulation order, threads only where they are free.
#include <algorithm>
#include <cstdint>
#include <thread>
#include <vector>

namespace moonrun::cpu {

// sum_i a[i] * b[i] with four partial sums: the compiler vectorises it without
// -ffast-math, and the summation order is fixed (the CUDA twins' references rely on it).
inline float dot(const float* a, const float* b, int n) {
  float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  int i = 0;
  for (; i + 4 <= n; i += 4) {
    s0 += a[i] * b[i];
    s1 += a[i + 1] * b[i + 1];
    s2 += a[i + 2] * b[i + 2];
    s3 += a[i + 3] * b[i + 3];
  }
  for (; i < n; ++i) s0 += a[i] * b[i];
  return (s0 + s1) + (s2 + s3);
}

// y[t, o] = sum_i x[t, i] * w[o, i] (nn.Linear: W row-major [out, in])
// x: [n_tokens, in], y: [n_tokens, out]
void matmul_xwT(const float* x, int n_tokens, int in_features, const float* w, int out_features,
                float* y);

// RMSNorm over the last dim of [n_rows, dim]: y = w * (x / sqrt(mean(x^2) + eps)).
// (Reference order: normalise in fp32, then multiply by the weight.)
void rmsnorm(const float* x, int n_rows, int dim, const float* weight, float eps, float* y);

inline float sigmoid(float x) { return 1.0f / (1.0f + __builtin_expf(-x)); }
float softplus(float x);  // log(1 + e^x), torch's threshold-20 form

// Number of worker threads the CPU backend uses (MOONRUN_CPU_THREADS, default: all cores).
int cpu_threads();

// Runs fn(h) for h in [0, n) (attention heads), split over the CPU threads when the work
// is worth a thread. Threads are started per call: cheap next to a prefill, visible in
// single-token decode (a persistent pool is the known next step).
template <typename Fn>
void parallel_heads(int n, int64_t work_per_item, Fn fn) {
  int n_threads = std::min(cpu_threads(), n);
  if (n_threads <= 1 || work_per_item * n < (1 << 16)) {
    for (int h = 0; h < n; ++h) fn(h);
    return;
  }
  std::vector<std::thread> threads;
  for (int k = 0; k < n_threads; ++k) {
    threads.emplace_back([&, k] {
      for (int h = k; h < n; h += n_threads) fn(h);
    });
  }
  for (auto& t : threads) t.join();
}

}  // namespace moonrun::cpu
