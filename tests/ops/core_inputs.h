#pragma once
// Large random inputs for the GEMM / dense / sampling op tests. K3's real shapes are big
// (the lm_head is 163840 x 7168 = 1.2e9 weights; std::normal_distribution would take half a
// minute), so these fills are counter-based (value i = hash(seed, i)) and split over the
// CPU threads: the same values for any thread count, and seconds for the largest shape.
#include <algorithm>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "backend/cpu/linear.h"
#include "backend/cuda/common/bf16.h"

namespace moonrun::optest {

inline uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Runs fn(begin, end) over [0, n) in one chunk per CPU thread.
template <typename Fn>
void parallel_for(size_t n, Fn fn) {
  const size_t n_threads = std::max<size_t>(1, std::min<size_t>(cpu::cpu_threads(), n / (1 << 16)));
  if (n_threads <= 1) return fn(size_t{0}, n);
  std::vector<std::thread> threads;
  const size_t per = (n + n_threads - 1) / n_threads;
  for (size_t k = 0; k < n_threads; ++k) {
    const size_t b = k * per, e = std::min(n, b + per);
    if (b < e) threads.emplace_back(fn, b, e);
  }
  for (auto& t : threads) t.join();
}

// Uniform in [lo, hi); bf16: rounded to bf16 (what a bf16 weight or activation holds).
inline std::vector<float> fast_uniform(size_t n, uint64_t seed, float lo, float hi, bool bf16 = false) {
  std::vector<float> x(n);
  const uint64_t key = splitmix64(seed);
  parallel_for(n, [&](size_t b, size_t e) {
    for (size_t i = b; i < e; ++i) {
      const float u01 = static_cast<float>(splitmix64(key ^ i) >> 40) * 0x1.0p-24f;
      const float v = lo + (hi - lo) * u01;
      x[i] = bf16 ? cuda::round_bf16(v) : v;
    }
  });
  return x;
}

// Integers in [lo, hi]: exact in bf16 and in fp32 sums, for the bit-exact cases.
inline std::vector<float> fast_small_ints(size_t n, uint64_t seed, int lo, int hi) {
  std::vector<float> x(n);
  const uint64_t key = splitmix64(seed);
  const uint64_t span = static_cast<uint64_t>(hi - lo + 1);
  parallel_for(n, [&](size_t b, size_t e) {
    for (size_t i = b; i < e; ++i) x[i] = static_cast<float>(lo + static_cast<int>(splitmix64(key ^ i) % span));
  });
  return x;
}

inline std::vector<cuda::bf16> to_bf16_parallel(const std::vector<float>& x) {
  std::vector<cuda::bf16> y(x.size());
  parallel_for(x.size(), [&](size_t b, size_t e) {
    for (size_t i = b; i < e; ++i) y[i] = __float2bfloat16_rn(x[i]);
  });
  return y;
}

inline std::string shape_str(std::initializer_list<long long> dims) {
  std::string s;
  for (long long d : dims) s += (s.empty() ? "" : "x") + std::to_string(d);
  return s;
}

}  // namespace moonrun::optest
