// The CPU reference kernels against hand-derivable values and independent double-precision
// formulas: MXFP4 codes from the OCP MX spec's E2M1 definition, SiTU, the router's grouped
// top-k, Attention Residuals, MLA's split-KV decode. (The LatentMoE block is tested in
// tests/unit/model.)
#include <cmath>
#include <cstdint>
#include <algorithm>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "backend/cpu/activations.h"
#include "backend/cpu/attn_res.h"
#include "backend/cpu/mla.h"
#include "backend/cpu/mxfp4.h"
#include "backend/cpu/router.h"

namespace moonrun::cpu {
namespace {

// OCP MX v1.0 E2M1: 1 sign, 2 exponent (bias 1), 1 mantissa bit; exponent 0 is subnormal.
double e2m1_spec(int code) {
  int sign = (code >> 3) & 1, exp = (code >> 1) & 3, man = code & 1;
  double mag = exp == 0 ? 0.5 * man : std::ldexp(1.0 + 0.5 * man, exp - 1);
  return sign ? -mag : mag;
}

TEST(Mxfp4, CodesMatchTheOcpTable) {
  const double table[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};  // the spec's listed magnitudes
  for (int c = 0; c < 16; ++c) {
    EXPECT_EQ(fp4_e2m1_value(static_cast<uint8_t>(c)), e2m1_spec(c)) << c;
    EXPECT_EQ(std::fabs(e2m1_spec(c)), table[c & 7]) << c;
  }
  EXPECT_EQ(e8m0_scale(127), 1.0f);
  EXPECT_EQ(e8m0_scale(130), 8.0f);
  EXPECT_EQ(e8m0_scale(120), std::ldexp(1.0f, -7));
  EXPECT_EQ(e8m0_scale(0), std::ldexp(1.0f, -127));
  EXPECT_TRUE(std::isnan(e8m0_scale(255)));
}

TEST(Mxfp4, DequantizeRowsNibbleOrderAndScales) {
  const int rows = 3, cols = 64;
  std::mt19937 rng(7);
  std::vector<uint8_t> codes(rows * cols / 2), scales(rows * cols / 32);
  for (auto& b : codes) b = static_cast<uint8_t>(rng() & 0xff);
  for (auto& s : scales) s = static_cast<uint8_t>(110 + rng() % 30);
  std::vector<float> out(rows * cols);
  dequantize_mxfp4(codes.data(), scales.data(), rows, cols, out.data());
  for (int r = 0; r < rows; ++r)
    for (int j = 0; j < cols; ++j) {
      uint8_t byte = codes[r * cols / 2 + j / 2];
      int nib = (j % 2 == 0) ? (byte & 0xf) : (byte >> 4);
      double want = e2m1_spec(nib) * std::pow(2.0, scales[r * cols / 32 + j / 32] - 127.0);
      ASSERT_EQ(out[r * cols + j], static_cast<float>(want)) << r << "," << j;
    }
  // A hand-made byte: 0x9A -> element 0 = code 0xA (-1.0), element 1 = code 0x9 (-0.5).
  uint8_t b[16] = {0x9A}, s[1] = {128};
  float row[32];
  dequantize_mxfp4(b, s, 1, 32, row);
  EXPECT_EQ(row[0], -2.0f);
  EXPECT_EQ(row[1], -1.0f);
  EXPECT_EQ(row[2], 0.0f);
}

TEST(Situ, MatchesTheDoubleFormula) {
  for (double g : {-30.0, -3.0, -0.5, 0.0, 0.25, 2.0, 7.0, 40.0})
    for (double u : {-60.0, -1.0, 0.0, 0.3, 5.0, 100.0}) {
      double want = 4.0 * std::tanh(g / 4.0) / (1.0 + std::exp(-g)) * 25.0 * std::tanh(u / 25.0);
      EXPECT_NEAR(situ(static_cast<float>(g), static_cast<float>(u), 4.0f, 25.0f), want,
                  1e-5 * std::max(1.0, std::fabs(want)));
      double want_nolin = 4.0 * std::tanh(g / 4.0) / (1.0 + std::exp(-g)) * u;
      EXPECT_NEAR(situ(static_cast<float>(g), static_cast<float>(u), 4.0f, 0.0f), want_nolin,
                  1e-5 * std::max(1.0, std::fabs(want_nolin)));
    }
}

double sigmoid_d(double x) { return 1.0 / (1.0 + std::exp(-x)); }

TEST(Router, GroupedTopKByHand) {
  // 8 experts in 4 groups of 2; keep 2 groups, choose 2 experts.
  // Biased scores are made so the single best expert (id 0) sits in a group whose top-2 sum
  // is low, so grouping must drop it.
  RouterParams p{8, 2, 4, 2, true, 2.5f};
  const double s[8] = {0.95, 0.05, 0.6, 0.55, 0.7, 0.3, 0.5, 0.52};  // target sigmoid scores
  float logits[8], bias[8] = {0, 0, 0, 0, 0, 0, 0, 0.1f};
  for (int e = 0; e < 8; ++e) logits[e] = static_cast<float>(std::log(s[e] / (1 - s[e])));
  // Group sums (biased): g0 = 1.00, g1 = 1.15, g2 = 1.00, g3 = 1.12 -> keep g1 and g3.
  // Inside: 2 (0.6), 3 (0.55), 6 (0.5), 7 (0.52 + 0.1 = 0.62) -> top-2 = 7, 2.
  int ids[2];
  float w[2];
  route_token(logits, bias, p, ids, w);
  EXPECT_EQ(ids[0], 7);
  EXPECT_EQ(ids[1], 2);
  // Weights use the unbiased scores, renormalised, times the scaling factor.
  EXPECT_NEAR(w[0], 0.52 / (0.52 + 0.6) * 2.5, 1e-6);
  EXPECT_NEAR(w[1], 0.6 / (0.52 + 0.6) * 2.5, 1e-6);

  // Ungrouped (num_expert_group == topk_group): plain top-k by biased score: 0, 4.
  RouterParams flat{8, 2, 1, 1, false, 1.0f};
  route_token(logits, bias, flat, ids, w);
  EXPECT_EQ(ids[0], 0);
  EXPECT_EQ(ids[1], 4);
  EXPECT_NEAR(w[0], 0.95, 1e-6);  // no renormalisation
  EXPECT_NEAR(w[1], 0.7, 1e-6);
}

// Split-KV (issue 47): the absorbed attention with a query's keys in S ranges, partials
// combined by their maxima, against the same attention in double precision written from the
// plain form (per-head keys k = W_uk c and values v = W_uv c expanded, softmax, sum) and
// against one range: a decode token over 9,000 cached positions, two tokens at once, S = 1,
// 3, 7 and 16 (uneven ranges), and 5 keys over 8 ranges (empty ones weigh nothing).
TEST(MlaSplitKv, MatchesTheDoubleFormulaAndOneRange) {
  MlaShape shape;
  shape.num_heads = 3;
  shape.kv_lora = 32;
  shape.rope = 8;
  shape.nope = 16;
  shape.v_dim = 16;
  const int H = shape.num_heads, L = shape.kv_lora, R = shape.rope, N = shape.nope, V = shape.v_dim;
  const int QD = N + R, KV = N + V;
  std::mt19937 rng(47);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  struct Case {
    int n_tokens, n_past;
  };
  for (const Case c : {Case{1, 9000}, Case{2, 5000}, Case{1, 4}}) {
    const int P = c.n_past + c.n_tokens;
    std::vector<float> q(static_cast<size_t>(c.n_tokens) * H * QD), kv_b(static_cast<size_t>(H) * KV * L),
        cache(static_cast<size_t>(P) * (L + R));
    for (auto& v : q) v = nd(rng);
    for (auto& v : kv_b) v = 0.3f * nd(rng);
    for (auto& v : cache) v = nd(rng);
    std::vector<const float*> rows(P);
    for (int p = 0; p < P; ++p) rows[p] = cache.data() + static_cast<size_t>(p) * (L + R);
    // The double reference, from the plain form.
    std::vector<double> want(static_cast<size_t>(c.n_tokens) * H * V);
    for (int t = 0; t < c.n_tokens; ++t)
      for (int h = 0; h < H; ++h) {
        const float* qt = q.data() + (static_cast<size_t>(t) * H + h) * QD;
        const float* Wk = kv_b.data() + static_cast<size_t>(h) * KV * L;
        const float* Wv = Wk + static_cast<size_t>(N) * L;
        const int n_keys = c.n_past + t + 1;
        std::vector<double> score(n_keys);
        double m = -1e300;
        for (int p = 0; p < n_keys; ++p) {
          double sc = 0;
          for (int n = 0; n < N; ++n) {
            double k = 0;
            for (int l = 0; l < L; ++l) k += static_cast<double>(Wk[n * L + l]) * rows[p][l];
            sc += qt[n] * k;
          }
          for (int r = 0; r < R; ++r) sc += static_cast<double>(qt[N + r]) * rows[p][L + r];
          score[p] = sc / std::sqrt(static_cast<double>(QD));
          m = std::max(m, score[p]);
        }
        double sum = 0;
        for (double& sc : score) sum += (sc = std::exp(sc - m));
        for (int j = 0; j < V; ++j) {
          double o = 0;
          for (int p = 0; p < n_keys; ++p) {
            double v = 0;
            for (int l = 0; l < L; ++l) v += static_cast<double>(Wv[j * L + l]) * rows[p][l];
            o += score[p] / sum * v;
          }
          want[(static_cast<size_t>(t) * H + h) * V + j] = o;
        }
      }
    double scale = 0;
    for (double v : want) scale = std::max(scale, std::abs(v));
    std::vector<float> one(want.size());
    mla_attend_absorbed(q.data(), kv_b.data(), shape, c.n_tokens, c.n_past, rows.data(), one.data(), nullptr, 0, 1);
    for (const int S : {1, 3, 7, 16, 8}) {
      std::vector<float> got(want.size());
      mla_attend_absorbed(q.data(), kv_b.data(), shape, c.n_tokens, c.n_past, rows.data(), got.data(), nullptr, 0, S);
      double vs_ref = 0, vs_one = 0;
      for (size_t i = 0; i < got.size(); ++i) {
        vs_ref = std::max(vs_ref, std::abs(got[i] - want[i]));
        vs_one = std::max(vs_one, static_cast<double>(std::abs(got[i] - one[i])));
      }
      EXPECT_LE(vs_ref, 2e-5 * scale) << c.n_past << " past, " << S << " ranges";
      EXPECT_LE(vs_one, 2e-5 * scale) << c.n_past << " past, " << S << " ranges vs one";
      if (S == 1) {
        EXPECT_EQ(got, one);
      }
    }
  }
  EXPECT_EQ(mla_cpu_kv_splits(1), 1);
  EXPECT_EQ(mla_cpu_kv_splits(8191), 1);
  EXPECT_EQ(mla_cpu_kv_splits(8192), 2);
  EXPECT_EQ(mla_cpu_kv_splits(1 << 20), 16);
}

TEST(AttnRes, MatchesTheDoubleFormula) {
  const int H = 16, T = 3, NB = 2;
  std::mt19937 rng(3);
  std::normal_distribution<float> n01;
  std::vector<float> b0(T * H), b1(T * H), pre(T * H), wn(H), wp(H), out(T * H);
  for (auto* v : {&b0, &b1, &pre, &wn, &wp})
    for (auto& x : *v) x = n01(rng);
  const float* blocks[NB] = {b0.data(), b1.data()};
  attn_res_mix(pre.data(), blocks, NB, T, H, wn.data(), wp.data(), 1e-5f, out.data());
  for (int t = 0; t < T; ++t) {
    const float* V[3] = {&b0[t * H], &b1[t * H], &pre[t * H]};
    double sc[3], mx = -1e300;
    for (int i = 0; i < 3; ++i) {
      double ss = 0;
      for (int c = 0; c < H; ++c) ss += double(V[i][c]) * V[i][c];
      double inv = 1.0 / std::sqrt(ss / H + 1e-5);
      sc[i] = 0;
      for (int c = 0; c < H; ++c) sc[i] += V[i][c] * inv * wn[c] * wp[c];
      mx = std::max(mx, sc[i]);
    }
    double z = 0;
    for (double& v : sc) z += (v = std::exp(v - mx));
    for (int c = 0; c < H; ++c) {
      double want = 0;
      for (int i = 0; i < 3; ++i) want += sc[i] / z * V[i][c];
      EXPECT_NEAR(out[t * H + c], want, 1e-5) << t << "," << c;
    }
  }
  // No blocks: the mix of one row is the row itself.
  attn_res_mix(pre.data(), nullptr, 0, T, H, wn.data(), wp.data(), 1e-5f, out.data());
  for (int i = 0; i < T * H; ++i) EXPECT_EQ(out[i], pre[i]);
}

}  // namespace
}  // namespace moonrun::cpu
