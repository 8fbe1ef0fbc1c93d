// The MoE block (model/layers/moe.cpp) on the CPU backend against the LatentMoE block in
// double, written from K3_SPEC.md §2 directly.
#include "model/layers/moe.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "../../support/host_tensors.h"
#include "backend/cpu/cpu_ops.h"

namespace moonrun {
namespace {

using moonrun::testing::HostMatrix;

double sigmoid_d(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// The LatentMoE block in double, written from K3_SPEC.md §2 directly.
struct HostMlp {
  HostMatrix gate, up, down;
};
struct HostMoe {
  HostMatrix router, latent_down, latent_up;
  std::vector<float> router_bias, latent_norm;
  std::vector<HostMlp> experts;
  HostMlp shared;
};

std::vector<double> moe_reference(const HostMoe& w, const MoeDims& d, const std::vector<float>& x, int T) {
  const int H = d.hidden, D = d.io_dim, E = d.router.num_experts, K = d.router.top_k;
  auto matvec = [](const HostMatrix& l, const std::vector<double>& v) {
    std::vector<double> r(l.out, 0.0);
    for (int o = 0; o < l.out; ++o)
      for (int i = 0; i < l.in; ++i) r[o] += double(l.w[size_t(o) * l.in + i]) * v[i];
    return r;
  };
  auto mlp = [&](const HostMlp& m, const std::vector<double>& v) {
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
    HostMatrix l{std::vector<float>(size_t(out) * in), out, in};
    for (auto& v : l.w) v = n01(rng) * scale;
    return l;
  };
  MoeDims d;
  d.hidden = H;
  d.io_dim = D;
  d.router = RouterParams{E, 2, 1, 1, true, 1.7f};
  d.act = ActivationParams{true, 4.0f, 25.0f};
  d.norm_eps = 1e-5f;
  HostMoe w;
  w.router = lin(E, H, 0.3f);
  for (int e = 0; e < E; ++e) w.router_bias.push_back(0.3f * (e % 3) - 0.3f);
  for (int e = 0; e < E; ++e) w.experts.push_back({lin(I, D, 0.4f), lin(I, D, 0.4f), lin(D, I, 0.4f)});
  w.shared = {lin(2 * I, H, 0.2f), lin(2 * I, H, 0.2f), lin(H, 2 * I, 0.2f)};
  w.latent_down = lin(D, H, 0.2f);
  w.latent_up = lin(H, D, 0.2f);
  for (int c = 0; c < D; ++c) w.latent_norm.push_back(1.0f + 0.1f * n01(rng));
  std::vector<float> x(size_t(T) * H), out(size_t(T) * H);
  for (auto& v : x) v = n01(rng);
  // On the CPU backend: experts stacked [E * out, in], as the loader lays them out.
  cpu::CpuOps ops;
  using moonrun::testing::upload;
  using moonrun::testing::upload_matrix;
  MoeWeights bw;
  bw.router = upload_matrix(ops, w.router);
  bw.router_bias = upload(ops, w.router_bias, 1, E);
  auto stack = [&](HostMatrix HostMlp::*which) {
    HostMatrix all{{}, 0, 0};
    for (const HostMlp& e : w.experts) {
      const HostMatrix& m = e.*which;
      all.w.insert(all.w.end(), m.w.begin(), m.w.end());
      all.in = m.in;
      all.out = m.out;
    }
    ExpertMatrices em;
    em.stacked.w = upload(ops, all.w, static_cast<int64_t>(E) * all.out, all.in);
    em.stacked.out = all.out;
    em.stacked.in = all.in;
    em.num_experts = E;
    return em;
  };
  bw.w1 = stack(&HostMlp::gate);
  bw.w3 = stack(&HostMlp::up);
  bw.w2 = stack(&HostMlp::down);
  bw.shared = {upload_matrix(ops, w.shared.gate), upload_matrix(ops, w.shared.up), upload_matrix(ops, w.shared.down)};
  bw.latent_down = upload_matrix(ops, w.latent_down);
  bw.latent_up = upload_matrix(ops, w.latent_up);
  bw.latent_norm = upload(ops, w.latent_norm, 1, D);
  Tensor xt = upload(ops, x, T, H);
  Tensor ot = ops.scratch(T, H, DType::F32);
  moe_forward(ops, bw, d, xt, xt, ot);
  out = moonrun::testing::download(ops, ot);
  auto want = moe_reference(w, d, x, T);
  for (size_t i = 0; i < out.size(); ++i) EXPECT_NEAR(out[i], want[i], 1e-4 * std::max(1.0, std::fabs(want[i]))) << i;
}

}  // namespace
}  // namespace moonrun
