// The CPU ops of the K3 text model against hand-derivable values and independent
// double-precision formulas (MXFP4 codes from the OCP MX spec's E2M1 definition, SiTU,
// the router's grouped top-k, Attention Residuals, the LatentMoE block).
#include <cmath>
#include <cstdint>
#include <algorithm>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/cpu/activations.h"
#include "kernels/cpu/attn_res.h"
#include "kernels/cpu/moe.h"
#include "kernels/cpu/mxfp4.h"
#include "kernels/cpu/router.h"

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

// The LatentMoE block in double, written from K3_SPEC.md §2 directly.
std::vector<double> moe_reference(const MoeWeights& w, const MoeDims& d, const std::vector<float>& x, int T) {
  const int H = d.hidden, D = d.io_dim, E = d.router.num_experts, K = d.router.top_k;
  auto matvec = [](const Linear& l, const std::vector<double>& v) {
    std::vector<double> r(l.out_features, 0.0);
    for (int o = 0; o < l.out_features; ++o)
      for (int i = 0; i < l.in_features; ++i) r[o] += double(l.w[size_t(o) * l.in_features + i]) * v[i];
    return r;
  };
  auto mlp = [&](const MlpWeights& m, const std::vector<double>& v) {
    auto g = matvec(m.gate, v), u = matvec(m.up, v);
    for (size_t i = 0; i < g.size(); ++i)
      g[i] = d.act.beta * std::tanh(g[i] / d.act.beta) * sigmoid_d(g[i]) * d.act.linear_beta *
             std::tanh(u[i] / d.act.linear_beta);
    return matvec(m.down, g);
  };
  std::vector<double> out(size_t(T) * H);
  for (int t = 0; t < T; ++t) {
    std::vector<double> xt(x.begin() + size_t(t) * H, x.begin() + size_t(t + 1) * H);
    auto logits = matvec(w.router, xt);
    std::vector<std::pair<double, int>> ch;
    for (int e = 0; e < E; ++e) ch.push_back({sigmoid_d(logits[e]) + w.router_bias[e], e});
    std::sort(ch.begin(), ch.end(), [](auto a, auto b) { return a.first > b.first; });
    auto z = matvec(w.latent_down, xt);
    std::vector<double> y(D, 0.0);
    double sum = 0;
    for (int k = 0; k < K; ++k) sum += sigmoid_d(logits[ch[k].second]);
    for (int k = 0; k < K; ++k) {
      int e = ch[k].second;
      double wk = sigmoid_d(logits[e]) / (sum + 1e-20) * d.router.routed_scaling_factor;
      auto o = mlp(w.experts[e], z);
      for (int c = 0; c < D; ++c) y[c] += wk * o[c];
    }
    double ss = 0;
    for (double v : y) ss += v * v;
    double inv = 1.0 / std::sqrt(ss / D + d.norm_eps);
    for (int c = 0; c < D; ++c) y[c] *= inv * w.latent_norm[c];
    auto up = matvec(w.latent_up, y);
    auto sh = mlp(w.shared, xt);
    for (int c = 0; c < H; ++c) out[size_t(t) * H + c] = up[c] + sh[c];
  }
  return out;
}

TEST(Moe, LatentMoeMatchesDoubleReference) {
  const int H = 32, D = 16, I = 8, E = 6, T = 5;
  std::mt19937 rng(11);
  std::normal_distribution<float> n01;
  auto lin = [&](int out, int in, float scale) {
    Linear l;
    l.out_features = out;
    l.in_features = in;
    l.w.resize(size_t(out) * in);
    for (auto& v : l.w) v = n01(rng) * scale;
    return l;
  };
  MoeDims d;
  d.hidden = H;
  d.io_dim = D;
  d.router = RouterParams{E, 2, 1, 1, true, 1.7f};
  d.act = ActivationParams{true, 4.0f, 25.0f};
  d.norm_eps = 1e-5f;
  MoeWeights w;
  w.router = lin(E, H, 0.3f);
  for (int e = 0; e < E; ++e) w.router_bias.push_back(0.3f * (e % 3) - 0.3f);
  for (int e = 0; e < E; ++e) w.experts.push_back({lin(I, D, 0.4f), lin(I, D, 0.4f), lin(D, I, 0.4f)});
  w.shared = {lin(2 * I, H, 0.2f), lin(2 * I, H, 0.2f), lin(H, 2 * I, 0.2f)};
  w.latent_down = lin(D, H, 0.2f);
  w.latent_up = lin(H, D, 0.2f);
  for (int c = 0; c < D; ++c) w.latent_norm.push_back(1.0f + 0.1f * n01(rng));
  std::vector<float> x(size_t(T) * H), out(size_t(T) * H);
  for (auto& v : x) v = n01(rng);
  moe_forward(w, d, x.data(), T, out.data());
  auto want = moe_reference(w, d, x, T);
  for (size_t i = 0; i < out.size(); ++i) EXPECT_NEAR(out[i], want[i], 1e-4 * std::max(1.0, std::fabs(want[i]))) << i;
}

}  // namespace
}  // namespace moonrun::cpu
