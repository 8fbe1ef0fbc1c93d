// The CPU reference kernels of KDA (backend/cpu/kda.h): the short conv by hand and in
// pieces, and the recurrence's two evaluation orders (token by token vs the chunked WY form)
// against each other, with an initial state and decays from weak to K3's strongest.
#include "backend/cpu/kda.h"

#include <gtest/gtest.h>

#include <cmath>

#include "../../support/host_tensors.h"

namespace moonrun::cpu {
namespace {

using moonrun::testing::max_abs;
using moonrun::testing::max_abs_diff;
using moonrun::testing::Rng;

// ---------------------------------------------------------------------------------------
// The short conv.

// Hand-derived: K = 4, weights w0..w3 (w3 multiplies the current input). With the window
// [a, b, c] (oldest first) and input d: pre-activation = w0 a + w1 b + w2 c + w3 d.
TEST(ShortConv, WindowSemanticsByHand) {
  const int K = 4, dim = 2;
  const float weight[dim * K] = {1, 2, 3, 4,       // channel 0
                                 0.5f, 0, 0, -1};  // channel 1
  float window[(K - 1) * dim] = {10, 1,            // oldest row: channel 0 = 10, ch 1 = 1
                                 20, 2,
                                 30, 3};           // newest row
  const float x[2 * dim] = {40, 4, 50, 5};
  float y[2 * dim];
  short_conv_silu(x, 2, dim, weight, K, window, y);
  auto silu = [](double a) { return a / (1 + std::exp(-a)); };
  // t=0: ch0 1*10 + 2*20 + 3*30 + 4*40 = 300; ch1 0.5*1 - 1*4 = -3.5
  // t=1: ch0 1*20 + 2*30 + 3*40 + 4*50 = 400; ch1 0.5*2 - 1*5 = -4
  EXPECT_NEAR(y[0], silu(300), 1e-3);
  EXPECT_NEAR(y[1], silu(-3.5), 1e-6);
  EXPECT_NEAR(y[2], silu(400), 1e-3);
  EXPECT_NEAR(y[3], silu(-4), 1e-6);
  // The window now holds the last three inputs, oldest first: 30, 40, 50 (ch0) / 3, 4, 5.
  const float expect[] = {30, 3, 40, 4, 50, 5};
  for (int i = 0; i < 6; ++i) EXPECT_EQ(window[i], expect[i]) << i;
}

// A fresh window is zeros: an impulse reads the taps out newest-first.
TEST(ShortConv, ImpulseResponseFromEmptyWindow) {
  const int K = 4;
  const float weight[K] = {0.1f, 0.2f, 0.3f, 0.4f};
  float window[K - 1] = {0, 0, 0};
  const float x[6] = {1, 0, 0, 0, 0, 0};
  float y[6];
  short_conv_silu(x, 6, 1, weight, K, window, y);
  const double pre[6] = {0.4, 0.3, 0.2, 0.1, 0, 0};
  for (int t = 0; t < 6; ++t) EXPECT_NEAR(y[t], pre[t] / (1 + std::exp(-pre[t])), 1e-7) << t;
}

TEST(ShortConv, PiecewiseEqualsOneShot) {
  Rng rng(7);
  const int K = 4, dim = 5, T = 11;
  std::vector<float> w = rng.vec(dim * K, -1, 1), x = rng.vec(T * dim, -2, 2);
  std::vector<float> win1((K - 1) * dim, 0.0f), win2 = win1, y1(T * dim), y2(T * dim);
  short_conv_silu(x.data(), T, dim, w.data(), K, win1.data(), y1.data());
  // Pieces of 1, 2 (shorter than the window) and 8 tokens.
  short_conv_silu(x.data(), 1, dim, w.data(), K, win2.data(), y2.data());
  short_conv_silu(x.data() + dim, 2, dim, w.data(), K, win2.data(), y2.data() + dim);
  short_conv_silu(x.data() + 3 * dim, 8, dim, w.data(), K, win2.data(), y2.data() + 3 * dim);
  EXPECT_EQ(y1, y2);
  EXPECT_EQ(win1, win2);
}

// ---------------------------------------------------------------------------------------
// The two evaluation orders of the recurrence.

struct KernelInputs {
  std::vector<float> q, k, v, g, beta, S0;
};

KernelInputs random_kernel_inputs(int T, int H, int d, float g_lo, unsigned seed) {
  Rng rng(seed);
  KernelInputs in;
  in.q = rng.vec(static_cast<size_t>(T) * H * d, -1, 1);
  in.k = rng.vec(in.q.size(), -1, 1);
  in.v = rng.vec(in.q.size(), -1, 1);
  in.g = rng.vec(in.q.size(), g_lo, 0);
  in.beta = rng.vec(static_cast<size_t>(T) * H, 0, 1);
  in.S0 = rng.vec(static_cast<size_t>(H) * d * d, -1, 1);
  // As the layer feeds them: unit-norm keys and queries, q scaled by d^-1/2.
  for (int r = 0; r < T * H; ++r) {
    double sq = 0, sk = 0;
    for (int i = 0; i < d; ++i) {
      sq += in.q[r * d + i] * in.q[r * d + i];
      sk += in.k[r * d + i] * in.k[r * d + i];
    }
    for (int i = 0; i < d; ++i) {
      in.q[r * d + i] /= std::sqrt(sq * d);
      in.k[r * d + i] /= std::sqrt(sk);
    }
  }
  return in;
}

void expect_chunked_equals_recurrent(int T, float g_lo, int chunk, unsigned seed) {
  const int H = 2, d = 16;
  KernelInputs in = random_kernel_inputs(T, H, d, g_lo, seed);
  std::vector<float> S_rec = in.S0, S_chk = in.S0;
  std::vector<float> o_rec(in.q.size()), o_chk(in.q.size());
  kda_recurrent(in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.beta.data(), T, H, d,
                S_rec.data(), o_rec.data());
  kda_chunked(in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.beta.data(), T, H, d,
              S_chk.data(), o_chk.data(), chunk);
  EXPECT_LT(max_abs_diff(o_rec, o_chk), 2e-5) << "T=" << T << " chunk=" << chunk;
  EXPECT_LT(max_abs_diff(S_rec, S_chk), 2e-5) << "T=" << T << " chunk=" << chunk;
  EXPECT_GT(max_abs(o_rec), 0.05);  // not trivially zero
}

TEST(KdaKernels, ChunkedEqualsRecurrentWithInitialState) {
  for (int T : {1, 5, 63, 64, 65, 130}) expect_chunked_equals_recurrent(T, -1.0f, 64, 100 + T);
}

TEST(KdaKernels, ChunkedEqualsRecurrentSmallChunks) {
  for (int T : {15, 16, 17, 50}) expect_chunked_equals_recurrent(T, -1.0f, 16, 200 + T);
}

// Decays near K3's lower bound (-5 per step, -320 over a chunk) must not overflow the
// chunked form's exponentials, and weak decays must not lose precision.
TEST(KdaKernels, ChunkedEqualsRecurrentStrongAndWeakDecay) {
  expect_chunked_equals_recurrent(130, -5.0f, 64, 300);
  expect_chunked_equals_recurrent(130, -0.01f, 64, 301);
  expect_chunked_equals_recurrent(70, -40.0f, 64, 302);  // softplus gates are unbounded
}

}  // namespace
}  // namespace moonrun::cpu
