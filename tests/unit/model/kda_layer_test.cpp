// The KDA layer (model/layers/kda.cpp) on the CPU backend against (1) a float64
// implementation written in this file straight from the formulas of K3_SPEC.md §2 / FLA's
// naive_recurrent_kda (plain loops, whole sequence at once), (2) itself in its other
// evaluation order (recurrent vs chunked WY), and (3) itself with the sequence fed in
// pieces (prefill then decode through the state slot).
#include "model/layers/kda.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "../../support/host_tensors.h"
#include "backend/cpu/cpu_ops.h"

namespace moonrun {
namespace {

using moonrun::testing::HostMatrix;
using moonrun::testing::max_abs;
using moonrun::testing::max_abs_diff;
using moonrun::testing::Rng;

// The layer's weights on the host.
struct HostKda {
  HostMatrix q_proj, k_proj, v_proj;
  std::vector<float> q_conv, k_conv, v_conv, A_log, dt_bias, o_norm;
  HostMatrix f_a_proj, f_b_proj, b_proj, g_proj, g_a_proj, g_b_proj, o_proj;
};

// ---------------------------------------------------------------------------------------
// The float64 reference: the whole layer for a sequence that starts empty.
struct KdaRef {
  std::vector<double> out;  // [T, hidden]
  std::vector<double> S;    // [H, d_k, d_v] after the last token
};

KdaRef kda_reference_f64(const HostKda& w, const KdaShape& dims, const std::vector<float>& x, int T) {
  using moonrun::testing::linear_f64;
  using moonrun::testing::sigmoid_f64;
  const int H = dims.num_heads, d = dims.head_dim, D = H * d, K = dims.conv_kernel;
  std::vector<double> xd(x.begin(), x.end());

  // conv1d over the sequence with zero history, then SiLU.
  auto conv = [&](const HostMatrix& proj, const std::vector<float>& wc) {
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
    moonrun::testing::rmsnorm_f64(&o[static_cast<size_t>(r) * d], d, w.o_norm, dims.norm_eps);
    for (int i = 0; i < d; ++i) o[r * d + i] *= sigmoid_f64(gate[r * d + i]);
  }
  ref.out = linear_f64(w.o_proj, o, T);
  return ref;
}

// A random small layer. K3 style: safe gate with lower bound -5 and a full-rank output gate;
// Kimi Linear style: softplus gate and a low-rank output gate.
struct Layer {
  KdaShape dims;
  HostKda w;
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
  HostKda& w = L.w;
  w.q_proj = rng.matrix(D, hidden, 2.0f);
  w.k_proj = rng.matrix(D, hidden, 2.0f);
  w.v_proj = rng.matrix(D, hidden, 2.0f);
  w.q_conv = rng.vec(static_cast<size_t>(D) * 4, -0.8f, 0.8f);
  w.k_conv = rng.vec(static_cast<size_t>(D) * 4, -0.8f, 0.8f);
  w.v_conv = rng.vec(static_cast<size_t>(D) * 4, -0.8f, 0.8f);
  // A = exp(A_log) in [1, 16] as in the reference's init.
  w.A_log = rng.vec(H, 0.0f, std::log(16.0f));
  w.dt_bias = rng.vec(D, -1.0f, 1.0f);
  w.f_a_proj = rng.matrix(d, hidden);
  w.f_b_proj = rng.matrix(D, d);
  w.b_proj = rng.matrix(H, hidden, 2.0f);
  if (k3_gate) {
    w.g_proj = rng.matrix(D, hidden, 2.0f);
  } else {
    w.g_a_proj = rng.matrix(d, hidden);
    w.g_b_proj = rng.matrix(D, d, 2.0f);
  }
  w.o_norm = rng.vec(d, 0.5f, 1.5f);
  w.o_proj = rng.matrix(hidden, D);
  return L;
}

// One sequence through the layer on the CPU backend, state in slot 0 of a one-slot pool.
struct LayerRun {
  const Layer& L;
  cpu::CpuOps ops;
  KdaWeights w;
  Tensor state;
  explicit LayerRun(const Layer& layer) : L(layer) {
    using moonrun::testing::upload;
    using moonrun::testing::upload_matrix;
    const HostKda& h = L.w;
    const int D = L.dims.proj_dim(), K = L.dims.conv_kernel;
    w.q_proj = upload_matrix(ops, h.q_proj);
    w.k_proj = upload_matrix(ops, h.k_proj);
    w.v_proj = upload_matrix(ops, h.v_proj);
    w.q_conv = upload(ops, h.q_conv, D, K);
    w.k_conv = upload(ops, h.k_conv, D, K);
    w.v_conv = upload(ops, h.v_conv, D, K);
    w.A_log = upload(ops, h.A_log, 1, L.dims.num_heads);
    w.dt_bias = upload(ops, h.dt_bias, 1, D);
    w.f_a_proj = upload_matrix(ops, h.f_a_proj);
    w.f_b_proj = upload_matrix(ops, h.f_b_proj);
    w.b_proj = upload_matrix(ops, h.b_proj);
    w.g_proj = upload_matrix(ops, h.g_proj);
    w.g_a_proj = upload_matrix(ops, h.g_a_proj);
    w.g_b_proj = upload_matrix(ops, h.g_b_proj);
    w.o_norm = upload(ops, h.o_norm, 1, L.dims.head_dim);
    w.o_proj = upload_matrix(ops, h.o_proj);
    state = ops.alloc(1, kda_state_floats(L.dims), DType::F32, "state");
  }
  // Tokens [begin, end) of x, the sequence having seen [0, begin) already.
  std::vector<float> forward(const std::vector<float>& x, int begin, int end, KdaMode mode) {
    ops.reset_scratch();
    const int H = L.dims.hidden, n = end - begin;
    ForwardBatch batch;
    std::vector<int32_t> ids(n, 0);
    batch.add_seq(ids.data(), n, begin, 0, nullptr, 0);
    const BatchView view = ops.upload_batch(batch);
    Tensor xt = moonrun::testing::upload(ops, std::vector<float>(x.begin() + static_cast<size_t>(begin) * H,
                                                                 x.begin() + static_cast<size_t>(end) * H),
                                         n, H);
    Tensor out = ops.scratch(n, H, DType::F32);
    kda_forward(ops, w, L.dims, xt, view, StateLayer{state.as<float>(), state.cols}, mode, out);
    return moonrun::testing::download(ops, out);
  }
  std::vector<float> S() const {
    const float* base = state.as<float>();
    return std::vector<float>(base + kda_s_offset(L.dims), base + state.cols);
  }
  std::vector<float> windows() const {
    const float* base = state.as<float>();
    return std::vector<float>(base, base + kda_s_offset(L.dims));
  }
};

// ---------------------------------------------------------------------------------------
// The whole layer.

void expect_layer_matches_reference(bool k3_gate, int T, KdaMode mode, unsigned seed) {
  Layer L = make_layer(k3_gate, seed);
  Rng rng(seed + 1);
  std::vector<float> x = rng.vec(static_cast<size_t>(T) * L.dims.hidden, -1, 1);
  KdaRef ref = kda_reference_f64(L.w, L.dims, x, T);
  LayerRun run(L);
  std::vector<float> out = run.forward(x, 0, T, mode);
  const double scale = std::max(1.0, max_abs(std::vector<float>(ref.out.begin(), ref.out.end())));
  EXPECT_LT(max_abs_diff(out, ref.out), 2e-5 * scale)
      << "k3_gate=" << k3_gate << " T=" << T << " mode=" << static_cast<int>(mode);
  EXPECT_LT(max_abs_diff(run.S(), ref.S), 2e-5);
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
  LayerRun one(L), pieces(L);
  std::vector<float> out_one = one.forward(x, 0, T, KdaMode::kAuto), out_pieces;
  int begin = 0;
  for (int end : cuts) {
    std::vector<float> o = pieces.forward(x, begin, end, KdaMode::kAuto);
    out_pieces.insert(out_pieces.end(), o.begin(), o.end());
    begin = end;
  }
  EXPECT_LT(max_abs_diff(out_one, out_pieces), 2e-5 * std::max(1.0, max_abs(out_one)));
  EXPECT_LT(max_abs_diff(one.S(), pieces.S()), 2e-5);
  EXPECT_EQ(one.windows(), pieces.windows());
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
}  // namespace moonrun
