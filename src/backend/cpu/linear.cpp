#include "backend/cpu/linear.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <thread>

namespace moonrun::cpu {

int cpu_threads() {
  static const int n = [] {
    if (const char* env = std::getenv("MOONRUN_CPU_THREADS")) {
      int v = std::atoi(env);
      if (v > 0) return v;
    }
    return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  }();
  return n;
}

namespace {
void matmul_rows(const float* x, int n_tokens, int in, const float* w, int out_begin,
                 int out_end, int out, float* y) {
  for (int o = out_begin; o < out_end; ++o) {
    const float* wr = w + static_cast<int64_t>(o) * in;
    for (int t = 0; t < n_tokens; ++t) {
      y[static_cast<int64_t>(t) * out + o] = dot(x + static_cast<int64_t>(t) * in, wr, in);
    }
  }
}
}  // namespace

void matmul_xwT(const float* x, int n_tokens, int in, const float* w, int out, float* y) {
  const int64_t work = static_cast<int64_t>(n_tokens) * in * out;
  int n_threads = std::min(cpu_threads(), std::max(1, out / 16));
  if (work < (1 << 18) || n_threads <= 1) {
    matmul_rows(x, n_tokens, in, w, 0, out, out, y);
    return;
  }
  std::vector<std::thread> threads;
  int per = (out + n_threads - 1) / n_threads;
  for (int k = 0; k < n_threads; ++k) {
    int b = k * per, e = std::min(out, b + per);
    if (b >= e) break;
    threads.emplace_back(matmul_rows, x, n_tokens, in, w, b, e, out, y);
  }
  for (auto& t : threads) t.join();
}

void rmsnorm(const float* x, int n_rows, int dim, const float* weight, float eps, float* y) {
  for (int r = 0; r < n_rows; ++r) {
    const float* xr = x + static_cast<int64_t>(r) * dim;
    float* yr = y + static_cast<int64_t>(r) * dim;
    double ss = 0;
    for (int i = 0; i < dim; ++i) ss += static_cast<double>(xr[i]) * xr[i];
    float inv = 1.0f / std::sqrt(static_cast<float>(ss / dim) + eps);
    for (int i = 0; i < dim; ++i) yr[i] = weight ? weight[i] * (xr[i] * inv) : xr[i] * inv;
  }
}

float softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }

}  // namespace moonrun::cpu
