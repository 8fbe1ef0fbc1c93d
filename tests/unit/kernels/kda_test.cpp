// KDA on the CPU against (1) a float64 implementation written in this file straight from the
// formulas of K3_SPEC.md §2 / FLA's naive_recurrent_kda (plain loops, whole sequence at once),
// (2) itself in its other evaluation order (recurrent vs chunked WY), and (3) itself with the
// sequence fed in pieces (prefill then decode through the cache).
#include "kernels/cpu/kda.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "test_util.h"

namespace moonrun::cpu {
namespace {

using testing::max_abs;
using testing::max_abs_diff;
using testing::Rng;

// ---------------------------------------------------------------------------------------
// The float64 reference: the whole layer for a sequence that starts empty.
struct KdaRef {
  std::vector<double> out;  // [T, hidden]
  std::vector<double> S;    // [H, d_k, d_v] after the last token
};

KdaRef kda_reference_f64(const KdaWeights& w, const KdaDims& dims, const std::vector<float>& x,
                         int T) {
  using testing::linear_f64;
  using testing::sigmoid_f64;
  const int H = dims.num_heads, d = dims.head_dim, D = H * d, K = dims.conv_kernel;
  std::vector<double> xd(x.begin(), x.end());

  // conv1d over the sequence with zero history, then SiLU.
  auto conv = [&](const Linear& proj, const std::vector<float>& wc) {
    std::vector<double> p = linear_f64(proj, xd, T), y(p.size());
    for (int t = 0; t < T; ++t)
      for (int c = 0; c < D; ++c) {
        double acc = 0;
        for (int j = 0; j < K; ++j) {
          int s = t - (K - 1) + j;
          if (s >= 0) acc += wc[c * K + j] * p[static_cast<size_t>(s) * D + c];
        }
        y[static_cast<size_t>(t) * D + c] = acc * sigmoid_f64(acc);
      }
    return y;
  };
  std::vector<double> q = conv(w.q_proj, w.q_conv), k = conv(w.k_proj, w.k_conv),
                      v = conv(w.v_proj, w.v_conv);
  // Per-head L2 norm (eps 1e-6 inside the sqrt), q scaled by d^-1/2.
  for (int r = 0; r < T * H; ++r) {
    double sq = 0, sk = 0;
    for (int i = 0; i < d; ++i) {
      sq += q[r * d + i] * q[r * d + i];
      sk += k[r * d + i] * k[r * d + i];
    }
    for (int i = 0; i < d; ++i) {
      q[r * d + i] /= std::sqrt(sq + 1e-6) * std::sqrt(static_cast<double>(d));
      k[r * d + i] /= std::sqrt(sk + 1e-6);
    }
  }
  // Decay gate.
  std::vector<double> g = linear_f64(w.f_b_proj, linear_f64(w.f_a_proj, xd, T), T);
  for (int t = 0; t < T; ++t)
    for (int h = 0; h < H; ++h)
      for (int i = 0; i < d; ++i) {
        double& gi = g[(static_cast<size_t>(t) * H + h) * d + i];
        const double raw = gi + w.dt_bias[h * d + i];
        const double a = std::exp(static_cast<double>(w.A_log[h]));
        if (std::isnan(dims.gate_lower_bound))
          gi = -a * std::log1p(std::exp(raw));  // softplus
        else
          gi = dims.gate_lower_bound * sigmoid_f64(a * raw);
      }
  std::vector<double> beta = linear_f64(w.b_proj, xd, T);
  for (double& b : beta) b = sigmoid_f64(b);

  // The delta rule, token by token.
  KdaRef ref;
  ref.S.assign(static_cast<size_t>(H) * d * d, 0.0);
  std::vector<double> o(static_cast<size_t>(T) * D);
  for (int h = 0; h < H; ++h) {
    double* S = &ref.S[static_cast<size_t>(h) * d * d];
    for (int t = 0; t < T; ++t) {
      const size_t r = (static_cast<size_t>(t) * H + h) * d;
      for (int i = 0; i < d; ++i)
        for (int j = 0; j < d; ++j) S[i * d + j] *= std::exp(g[r + i]);
      std::vector<double> pred(d, 0.0);  // S^T k
      for (int i = 0; i < d; ++i)
        for (int j = 0; j < d; ++j) pred[j] += S[i * d + j] * k[r + i];
      const double b = beta[static_cast<size_t>(t) * H + h];
      for (int i = 0; i < d; ++i)
        for (int j = 0; j < d; ++j) S[i * d + j] += b * k[r + i] * (v[r + j] - pred[j]);
      for (int j = 0; j < d; ++j) {
        double s = 0;
        for (int i = 0; i < d; ++i) s += S[i * d + j] * q[r + i];
        o[r + j] = s;
      }
    }
  }
  // Gated RMSNorm per head, then o_proj.
  std::vector<double> gate = w.g_proj.empty()
                                 ? linear_f64(w.g_b_proj, linear_f64(w.g_a_proj, xd, T), T)
                                 : linear_f64(w.g_proj, xd, T);
  for (int r = 0; r < T * H; ++r) {
    testing::rmsnorm_f64(&o[static_cast<size_t>(r) * d], d, w.o_norm, dims.norm_eps);
    for (int i = 0; i < d; ++i) o[r * d + i] *= sigmoid_f64(gate[r * d + i]);
  }
  ref.out = linear_f64(w.o_proj, o, T);
  return ref;
}

// ---------------------------------------------------------------------------------------
// A random small layer. K3 style: safe gate with lower bound -5 and a full-rank output gate;
// Kimi Linear style: softplus gate and a low-rank output gate.
struct Layer {
  KdaDims dims;
  KdaWeights w;
};

Layer make_layer(bool k3_gate, unsigned seed, int hidden = 24, int H = 3, int d = 8) {
  Rng rng(seed);
  Layer L;
  L.dims.hidden = hidden;
  L.dims.num_heads = H;
  L.dims.head_dim = d;
  L.dims.conv_kernel = 4;
  L.dims.norm_eps = 1e-5f;
  L.dims.gate_lower_bound = k3_gate ? -5.0f : std::numeric_limits<float>::quiet_NaN();
  const int D = H * d;
  KdaWeights& w = L.w;
  w.q_proj = rng.linear(D, hidden, 2.0f);
  w.k_proj = rng.linear(D, hidden, 2.0f);
  w.v_proj = rng.linear(D, hidden, 2.0f);
  w.q_conv = rng.vec(static_cast<size_t>(D) * 4, -0.8f, 0.8f);
  w.k_conv = rng.vec(static_cast<size_t>(D) * 4, -0.8f, 0.8f);
  w.v_conv = rng.vec(static_cast<size_t>(D) * 4, -0.8f, 0.8f);
  // A = exp(A_log) in [1, 16] as in the reference's init.
  w.A_log = rng.vec(H, 0.0f, std::log(16.0f));
  w.dt_bias = rng.vec(D, -1.0f, 1.0f);
  w.f_a_proj = rng.linear(d, hidden);
  w.f_b_proj = rng.linear(D, d);
  w.b_proj = rng.linear(H, hidden, 2.0f);
  if (k3_gate) {
    w.g_proj = rng.linear(D, hidden, 2.0f);
  } else {
    w.g_a_proj = rng.linear(d, hidden);
    w.g_b_proj = rng.linear(D, d, 2.0f);
  }
  w.o_norm = rng.vec(d, 0.5f, 1.5f);
  w.o_proj = rng.linear(hidden, D);
  return L;
}

std::vector<float> run_layer(const Layer& L, const std::vector<float>& x, int begin, int end,
                             KdaCache& cache, KdaMode mode) {
  std::vector<float> out(static_cast<size_t>(end - begin) * L.dims.hidden);
  kda_forward(L.w, L.dims, x.data() + static_cast<size_t>(begin) * L.dims.hidden, end - begin,
              cache, out.data(), mode);
  return out;
}

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

// ---------------------------------------------------------------------------------------
// The whole layer.

void expect_layer_matches_reference(bool k3_gate, int T, KdaMode mode, unsigned seed) {
  Layer L = make_layer(k3_gate, seed);
  Rng rng(seed + 1);
  std::vector<float> x = rng.vec(static_cast<size_t>(T) * L.dims.hidden, -1, 1);
  KdaRef ref = kda_reference_f64(L.w, L.dims, x, T);
  KdaCache cache;
  cache.reset(L.dims);
  std::vector<float> out = run_layer(L, x, 0, T, cache, mode);
  const double scale = std::max(1.0, max_abs(std::vector<float>(ref.out.begin(), ref.out.end())));
  EXPECT_LT(max_abs_diff(out, ref.out), 2e-5 * scale)
      << "k3_gate=" << k3_gate << " T=" << T << " mode=" << static_cast<int>(mode);
  EXPECT_LT(max_abs_diff(cache.S, ref.S), 2e-5);
  EXPECT_GT(max_abs(out), 1e-3);
}

TEST(KdaLayer, MatchesFloat64ReferenceK3Gate) {
  for (int T : {1, 5, 64, 65, 130}) expect_layer_matches_reference(true, T, KdaMode::kChunked, T);
  expect_layer_matches_reference(true, 40, KdaMode::kRecurrent, 41);
}

TEST(KdaLayer, MatchesFloat64ReferenceSoftplusGate) {
  for (int T : {1, 5, 64, 65, 130})
    expect_layer_matches_reference(false, T, KdaMode::kChunked, 500 + T);
  expect_layer_matches_reference(false, 40, KdaMode::kRecurrent, 541);
}

// The cache carries everything: prefill in pieces and decode token by token give what one
// prefill of the whole sequence gives, outputs and final state.
void expect_pieces_equal_one_shot(bool k3_gate, const std::vector<int>& cuts, unsigned seed) {
  Layer L = make_layer(k3_gate, seed);
  const int T = cuts.back();
  Rng rng(seed + 1);
  std::vector<float> x = rng.vec(static_cast<size_t>(T) * L.dims.hidden, -1, 1);
  KdaCache one, pieces;
  one.reset(L.dims);
  pieces.reset(L.dims);
  std::vector<float> out_one = run_layer(L, x, 0, T, one, KdaMode::kAuto), out_pieces;
  int begin = 0;
  for (int end : cuts) {
    std::vector<float> o = run_layer(L, x, begin, end, pieces, KdaMode::kAuto);
    out_pieces.insert(out_pieces.end(), o.begin(), o.end());
    begin = end;
  }
  EXPECT_LT(max_abs_diff(out_one, out_pieces), 2e-5 * std::max(1.0, max_abs(out_one)));
  EXPECT_LT(max_abs_diff(one.S, pieces.S), 2e-5);
  EXPECT_EQ(one.conv_q, pieces.conv_q);
  EXPECT_EQ(one.conv_k, pieces.conv_k);
  EXPECT_EQ(one.conv_v, pieces.conv_v);
}

TEST(KdaLayer, PrefillThenDecodeEqualsOneShot) {
  // 70-token prefill (a full and a partial chunk), then 12 decode steps.
  std::vector<int> cuts = {70};
  for (int t = 71; t <= 82; ++t) cuts.push_back(t);
  expect_pieces_equal_one_shot(true, cuts, 11);
  expect_pieces_equal_one_shot(false, cuts, 12);
}

TEST(KdaLayer, ChunkedPrefillInPiecesEqualsOneShot) {
  // Pieces shorter than the conv window and pieces crossing chunk boundaries.
  expect_pieces_equal_one_shot(true, {2, 3, 40, 100, 101, 130}, 13);
}

}  // namespace
}  // namespace moonrun::cpu
