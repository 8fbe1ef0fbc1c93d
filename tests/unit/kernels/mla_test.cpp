// Gated MLA (NoPE) on the CPU against (1) a float64 implementation written in this file from
// the formulas of K3_SPEC.md §2 / KimiMLAAttention (explicit per-head keys and values and a
// masked softmax over the whole sequence), (2) itself in its other form (plain vs absorbed),
// and (3) itself fed in pieces through the latent cache (prefill then decode).
#include "kernels/cpu/mla.h"

#include <gtest/gtest.h>

#include <cmath>

#include "test_util.h"

namespace moonrun::cpu {
namespace {

using testing::max_abs;
using testing::max_abs_diff;
using testing::Rng;

struct Layer {
  MlaDims dims;
  MlaWeights w;
};

Layer make_layer(bool q_lora, bool output_gate, unsigned seed) {
  Rng rng(seed);
  Layer L;
  MlaDims& m = L.dims;
  m.hidden = 32;
  m.num_heads = 3;
  m.q_lora_rank = q_lora ? 24 : 0;
  m.kv_lora_rank = 20;
  m.qk_nope_head_dim = 8;
  m.qk_rope_head_dim = 4;
  m.v_head_dim = 6;
  m.output_gate = output_gate;
  const int H = m.num_heads, QD = m.q_head_dim();
  MlaWeights& w = L.w;
  if (q_lora) {
    w.q_a_proj = rng.linear(m.q_lora_rank, m.hidden);
    w.q_a_layernorm = rng.vec(m.q_lora_rank, 0.5f, 1.5f);
    w.q_b_proj = rng.linear(H * QD, m.q_lora_rank, 3.0f);
  } else {
    w.q_proj = rng.linear(H * QD, m.hidden, 3.0f);
  }
  w.kv_a_proj_with_mqa = rng.linear(m.kv_lora_rank + m.qk_rope_head_dim, m.hidden, 2.0f);
  w.kv_a_layernorm = rng.vec(m.kv_lora_rank, 0.5f, 1.5f);
  w.kv_b_proj = rng.linear(H * (m.qk_nope_head_dim + m.v_head_dim), m.kv_lora_rank, 2.0f);
  w.o_proj = rng.linear(m.hidden, H * m.v_head_dim);
  if (output_gate) w.g_proj = rng.linear(H * m.v_head_dim, m.hidden, 2.0f);
  return L;
}

// ---------------------------------------------------------------------------------------
// The float64 reference, whole sequence at once. Also returns the cache rows it implies.
struct MlaRef {
  std::vector<double> out;   // [T, hidden]
  std::vector<double> rows;  // [T, kv_lora + rope]
};

MlaRef mla_reference_f64(const MlaWeights& w, const MlaDims& m, const std::vector<float>& x,
                         int T) {
  using testing::linear_f64;
  using testing::rmsnorm_f64;
  const int H = m.num_heads, L = m.kv_lora_rank, R = m.qk_rope_head_dim;
  const int N = m.qk_nope_head_dim, V = m.v_head_dim, QD = N + R;
  std::vector<double> xd(x.begin(), x.end());
  std::vector<double> q;
  if (m.q_lora_rank > 0) {
    std::vector<double> qa = linear_f64(w.q_a_proj, xd, T);
    for (int t = 0; t < T; ++t)
      rmsnorm_f64(&qa[static_cast<size_t>(t) * m.q_lora_rank], m.q_lora_rank, w.q_a_layernorm,
                  m.q_a_norm_eps);
    q = linear_f64(w.q_b_proj, qa, T);
  } else {
    q = linear_f64(w.q_proj, xd, T);
  }
  MlaRef ref;
  ref.rows = linear_f64(w.kv_a_proj_with_mqa, xd, T);
  std::vector<double> latent(static_cast<size_t>(T) * L);
  for (int t = 0; t < T; ++t) {
    rmsnorm_f64(&ref.rows[static_cast<size_t>(t) * (L + R)], L, w.kv_a_layernorm, m.kv_a_norm_eps);
    for (int l = 0; l < L; ++l) latent[t * L + l] = ref.rows[t * (L + R) + l];
  }
  std::vector<double> kv = linear_f64(w.kv_b_proj, latent, T);  // [T, H, nope | v]
  // key_h(p) = [k_nope_h(p) | k_pe(p)], query_h(t) = [q_nope | q_pe], causal softmax.
  std::vector<double> o(static_cast<size_t>(T) * H * V, 0.0);
  const double scale = 1.0 / std::sqrt(static_cast<double>(QD));
  for (int h = 0; h < H; ++h)
    for (int t = 0; t < T; ++t) {
      std::vector<double> s(T, -INFINITY);
      double mx = -INFINITY;
      for (int p = 0; p <= t; ++p) {
        double dotv = 0;
        for (int i = 0; i < N; ++i) dotv += q[(t * H + h) * QD + i] * kv[(p * H + h) * (N + V) + i];
        for (int i = 0; i < R; ++i) dotv += q[(t * H + h) * QD + N + i] * ref.rows[p * (L + R) + L + i];
        s[p] = dotv * scale;
        mx = std::max(mx, s[p]);
      }
      double z = 0;
      for (int p = 0; p <= t; ++p) z += std::exp(s[p] - mx);
      for (int p = 0; p <= t; ++p) {
        const double a = std::exp(s[p] - mx) / z;
        for (int j = 0; j < V; ++j) o[(t * H + h) * V + j] += a * kv[(p * H + h) * (N + V) + N + j];
      }
    }
  if (m.output_gate) {
    std::vector<double> g = linear_f64(w.g_proj, xd, T);
    for (size_t i = 0; i < o.size(); ++i) o[i] *= testing::sigmoid_f64(g[i]);
  }
  ref.out = linear_f64(w.o_proj, o, T);
  return ref;
}

// ---------------------------------------------------------------------------------------
// A sequence's latent cache: one row per position.
struct Cache {
  std::vector<float> data;
  std::vector<float*> rows;
  Cache(int n_positions, int row) : data(static_cast<size_t>(n_positions) * row, NAN) {
    for (int p = 0; p < n_positions; ++p) rows.push_back(&data[static_cast<size_t>(p) * row]);
  }
};

std::vector<float> run(const Layer& L, const std::vector<float>& x, int begin, int end,
                       Cache& cache, MlaMode mode) {
  std::vector<float> out(static_cast<size_t>(end - begin) * L.dims.hidden);
  mla_forward(L.w, L.dims, x.data() + static_cast<size_t>(begin) * L.dims.hidden, end - begin,
              begin, cache.rows.data(), out.data(), mode);
  return out;
}

void expect_matches_reference(bool q_lora, bool gate, MlaMode mode, unsigned seed) {
  Layer L = make_layer(q_lora, gate, seed);
  const int T = 19;
  Rng rng(seed + 1);
  std::vector<float> x = rng.vec(static_cast<size_t>(T) * L.dims.hidden, -1, 1);
  MlaRef ref = mla_reference_f64(L.w, L.dims, x, T);
  Cache cache(T, L.dims.cache_row());
  std::vector<float> out = run(L, x, 0, T, cache, mode);
  const double scale = std::max(1.0, max_abs(std::vector<float>(ref.out.begin(), ref.out.end())));
  EXPECT_LT(max_abs_diff(out, ref.out), 2e-5 * scale)
      << "q_lora=" << q_lora << " gate=" << gate << " mode=" << static_cast<int>(mode);
  EXPECT_LT(max_abs_diff(cache.data, ref.rows), 2e-5);
  EXPECT_GT(max_abs(out), 1e-3);
}

TEST(MlaLayer, MatchesFloat64Reference) {
  unsigned seed = 1;
  for (bool q_lora : {true, false})
    for (bool gate : {true, false})
      for (MlaMode mode : {MlaMode::kPlain, MlaMode::kAbsorbed})
        expect_matches_reference(q_lora, gate, mode, seed++);
}

// The absorbed form is the plain form regrouped: same outputs for a prefill and for a
// continuation over a non-empty cache.
TEST(MlaLayer, AbsorbedEqualsPlain) {
  for (bool q_lora : {true, false}) {
    Layer L = make_layer(q_lora, true, 40 + q_lora);
    const int T = 23;
    Rng rng(9);
    std::vector<float> x = rng.vec(static_cast<size_t>(T) * L.dims.hidden, -1, 1);
    Cache c1(T, L.dims.cache_row()), c2(T, L.dims.cache_row());
    for (auto [b, e] : {std::pair{0, 9}, std::pair{9, 10}, std::pair{10, 23}}) {
      std::vector<float> plain = run(L, x, b, e, c1, MlaMode::kPlain);
      std::vector<float> absorbed = run(L, x, b, e, c2, MlaMode::kAbsorbed);
      EXPECT_LT(max_abs_diff(plain, absorbed), 1e-5 * std::max(1.0, max_abs(plain)))
          << "q_lora=" << q_lora << " tokens " << b << ".." << e;
    }
    EXPECT_EQ(c1.data, c2.data);
  }
}

// Prefill then token-by-token decode (absorbed, through the cache rows) equals one prefill.
TEST(MlaLayer, PrefillThenDecodeEqualsOneShot) {
  Layer L = make_layer(true, true, 77);
  const int T = 30, prefill = 17;
  Rng rng(78);
  std::vector<float> x = rng.vec(static_cast<size_t>(T) * L.dims.hidden, -1, 1);
  Cache one(T, L.dims.cache_row()), pieces(T, L.dims.cache_row());
  std::vector<float> out_one = run(L, x, 0, T, one, MlaMode::kAuto);
  std::vector<float> out_pieces = run(L, x, 0, prefill, pieces, MlaMode::kAuto);
  for (int t = prefill; t < T; ++t) {
    std::vector<float> o = run(L, x, t, t + 1, pieces, MlaMode::kAuto);
    out_pieces.insert(out_pieces.end(), o.begin(), o.end());
  }
  EXPECT_LT(max_abs_diff(out_one, out_pieces), 1e-5 * std::max(1.0, max_abs(out_one)));
  EXPECT_EQ(one.data, pieces.data);
}

}  // namespace
}  // namespace moonrun::cpu
