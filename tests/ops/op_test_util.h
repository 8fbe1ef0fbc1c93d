#pragma once
// Shared by the CUDA op tests (tests/ops): random inputs, the normalised error every op's
// threshold is stated in, a GPU guard, and one "OPERR" line per check that
// scripts/gpu-check.sh collects into its summary table.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/common/bf16.h"
#include "backend/cuda/common/device_info.h"

namespace moonrun::optest {

#define REQUIRE_GPU()                                                          \
  do {                                                                         \
    if (::moonrun::cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device"; \
  } while (0)

inline std::vector<float> random_normal(size_t n, uint64_t seed, float stddev = 1.0f, float mean = 0.0f) {
  std::mt19937_64 gen(seed);
  std::normal_distribution<float> d(mean, stddev);
  std::vector<float> x(n);
  for (auto& v : x) v = d(gen);
  return x;
}
inline std::vector<float> random_uniform(size_t n, uint64_t seed, float lo, float hi) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> x(n);
  for (auto& v : x) v = d(gen);
  return x;
}
// Small integers in [lo, hi]: exact in bf16 and in fp32 sums, for the bit-exact cases.
inline std::vector<float> random_small_ints(size_t n, uint64_t seed, int lo, int hi) {
  std::mt19937_64 gen(seed);
  std::uniform_int_distribution<int> d(lo, hi);
  std::vector<float> x(n);
  for (auto& v : x) v = static_cast<float>(d(gen));
  return x;
}
// The values as bf16 storage holds them (feed these to the CPU reference so that the
// comparison measures the kernel, not the input rounding).
inline std::vector<float> bf16_rounded(std::vector<float> x) {
  for (auto& v : x) v = cuda::round_bf16(v);
  return x;
}

// max |got - want| / max(max |want|, 1e-30): scale-free, so one threshold serves every shape.
inline double normalised_error(const std::vector<float>& got, const std::vector<float>& want) {
  if (got.size() != want.size()) return INFINITY;
  double max_diff = 0, max_ref = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double d = std::fabs(static_cast<double>(got[i]) - want[i]);
    if (!(d <= max_diff)) max_diff = std::isnan(d) ? INFINITY : d;
    max_ref = std::max(max_ref, std::fabs(static_cast<double>(want[i])));
  }
  return max_diff / std::max(max_ref, 1e-30);
}

// Checks err <= threshold and prints the line gpu-check.sh tabulates:
//   OPERR <op> <shape> <err> <threshold> <ok|FAIL>
inline void expect_close(const std::string& op, const std::string& shape, double err, double threshold) {
  std::printf("OPERR %s %s %.3e %.1e %s\n", op.c_str(), shape.c_str(), err, threshold,
              err <= threshold ? "ok" : "FAIL");
  EXPECT_LE(err, threshold) << op << " " << shape;
}
// Bit-exact cases: every element equal.
inline void expect_exact(const std::string& op, const std::string& shape, const std::vector<float>& got,
                         const std::vector<float>& want) {
  size_t bad = got.size() == want.size() ? 0 : 1;
  for (size_t i = 0; i < got.size() && i < want.size(); ++i) bad += got[i] != want[i];
  std::printf("OPERR %s %s %s %s %s\n", op.c_str(), shape.c_str(), bad ? "mismatch" : "0", "exact",
              bad ? "FAIL" : "ok");
  EXPECT_EQ(bad, 0u) << op << " " << shape << ": " << bad << " elements differ";
}

}  // namespace moonrun::optest
