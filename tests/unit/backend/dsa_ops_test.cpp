// DeepSeek Sparse Attention's CPU ops (issue 38; backend/cpu/dsa.h) against plain
// double-precision loops written from DeepSeek-V3.2-Exp's Indexer and MLA (inference/model.py):
// the indexer-key store (LayerNorm), the index scores, the causal top-k, and MLA over the
// selected keys; on one batch of several sequences over scattered pages, with first and later
// prefill chunks and single-token decodes. The cross-check that ties the sparse path to the
// tested dense one: with k at least the visible context, sparse attention is mla_attention.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/dsa.h"
#include "backend/dsa_index_row.h"

namespace moonrun::cpu {
namespace {

constexpr int kPageSize = 4;
constexpr int kPages = 24;

std::vector<float> normal(size_t n, uint32_t seed, float sd = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, sd);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

Tensor put(CpuOps& ops, const std::vector<float>& v, int64_t rows, int64_t cols) {
  Tensor t = ops.alloc(rows, cols, DType::F32, "test");
  EXPECT_EQ(v.size(), static_cast<size_t>(rows * cols));
  ops.upload(t, 0, v.data(), v.size() * sizeof(float));
  return t;
}

// Four sequences over pages handed out in a scrambled order: a first prefill chunk, a later
// chunk after 9 cached tokens, and decodes after 20 and after 3.
struct DsaBatch {
  ForwardBatch fb;
  std::vector<int> n_past{0, 9, 20, 3}, n_new{11, 7, 1, 1};
  DsaBatch() {
    std::vector<int32_t> pages(kPages);
    std::iota(pages.begin(), pages.end(), 0);
    std::shuffle(pages.begin(), pages.end(), std::mt19937(7));
    int next = 0;
    for (size_t s = 0; s < n_past.size(); ++s) {
      const int n_pos = n_past[s] + n_new[s], n_pg = (n_pos + kPageSize - 1) / kPageSize;
      std::vector<int32_t> ids(n_new[s], 1);
      fb.add_seq(ids.data(), n_new[s], n_past[s], -1, pages.data() + next, n_pg);
      next += n_pg;
    }
  }
  int n_tokens() const { return fb.n_tokens(); }
  int max_positions() const {
    int m = 0;
    for (size_t s = 0; s < n_past.size(); ++s) m = std::max(m, n_past[s] + n_new[s]);
    return m;
  }
  // The cache row of position p of token t's sequence.
  int64_t row_of(int t, int p) const {
    const BatchSeq& seq = fb.seqs[fb.token_seq[t]];
    return static_cast<int64_t>(fb.page_table[seq.page_start + p / kPageSize]) * kPageSize + p % kPageSize;
  }
};

struct Fixture {
  CpuOps ops;
  DsaBatch db;
  BatchView view;
  MlaShape mla{4, 32, 16, 8, 24};
  DsaIndexerShape idx{4, 16};
  float eps = 1e-5f;
  Tensor latent_cache, key_cache, q_idx, w_idx, q_mla;
  Matrix kv_b;
  std::vector<float> k_raw, ln_w, ln_b;

  Fixture() {
    view = ops.upload_batch(db.fb);
    const int T = db.n_tokens(), P = kPages * kPageSize;
    const int row = mla.row_width(), qd = mla.nope + mla.rope;
    // Pools already holding the past positions' rows; the new tokens' rows are stored below.
    latent_cache = put(ops, normal(static_cast<size_t>(P) * row, 1), P, row);
    key_cache = put(ops, normal(static_cast<size_t>(P) * idx.head_dim, 2), P, idx.head_dim);
    Tensor ckv = put(ops, normal(static_cast<size_t>(T) * row, 3, 2.0f), T, row);
    std::vector<float> nw(mla.kv_lora, 1.0f);
    ops.mla_store(ckv, put(ops, nw, 1, mla.kv_lora), 1e-6f, view, latent_kv());
    k_raw = normal(static_cast<size_t>(T) * idx.head_dim, 4, 3.0f);
    for (float& x : k_raw) x += 0.5f;  // a mean for the LayerNorm to take away
    ln_w = normal(idx.head_dim, 5, 0.3f);
    for (float& x : ln_w) x += 1.0f;
    ln_b = normal(idx.head_dim, 6, 0.1f);
    ops.dsa_index_store(put(ops, k_raw, T, idx.head_dim), put(ops, ln_w, 1, idx.head_dim),
                        put(ops, ln_b, 1, idx.head_dim), eps, view, index_kv());
    q_idx = put(ops, normal(static_cast<size_t>(T) * idx.num_heads * idx.head_dim, 7), T,
                idx.num_heads * idx.head_dim);
    w_idx = put(ops, normal(static_cast<size_t>(T) * idx.num_heads, 8), T, idx.num_heads);
    q_mla = put(ops, normal(static_cast<size_t>(T) * mla.num_heads * qd, 9), T, mla.num_heads * qd);
    const int kv_out = mla.num_heads * (mla.nope + mla.v_dim);
    kv_b.w = put(ops, normal(static_cast<size_t>(kv_out) * mla.kv_lora, 10, 0.2f), kv_out, mla.kv_lora);
    kv_b.out = kv_out;
    kv_b.in = mla.kv_lora;
  }
  KvLayer latent_kv() const { return {latent_cache.data, DType::F32, kPageSize, mla.row_width()}; }
  KvLayer index_kv() const { return {key_cache.data, DType::F32, kPageSize, idx.head_dim}; }
  const float* key(int t, int p) const { return key_cache.as<float>() + db.row_of(t, p) * idx.head_dim; }
  const float* latent(int t, int p) const { return latent_cache.as<float>() + db.row_of(t, p) * mla.row_width(); }

  // The reference's index score, in double: weights_proj(x) * n_heads^-1/2 * head_dim^-1/2,
  // times ReLU(q_h . k), summed over heads.
  double ref_score(int t, int p) const {
    const int H = idx.num_heads, D = idx.head_dim;
    double s = 0;
    for (int h = 0; h < H; ++h) {
      double d = 0;
      for (int i = 0; i < D; ++i) d += double(q_idx.as<float>()[(int64_t(t) * H + h) * D + i]) * key(t, p)[i];
      s += double(w_idx.as<float>()[int64_t(t) * H + h]) / std::sqrt(double(H)) / std::sqrt(double(D)) *
           std::max(0.0, d);
    }
    return s;
  }

  // MLA over the given positions of token t's sequence, in double and in plain order (kv_b
  // expanded into per-head keys and values), as the reference's masked prefill does.
  std::vector<double> ref_attention(int t, const std::vector<int>& keys) const {
    const int H = mla.num_heads, L = mla.kv_lora, N = mla.nope, R = mla.rope, V = mla.v_dim, QD = N + R;
    const float* W = kv_b.w.as<float>();
    std::vector<double> o(static_cast<size_t>(H) * V, 0.0);
    for (int h = 0; h < H; ++h) {
      const float* qh = q_mla.as<float>() + (int64_t(t) * H + h) * QD;
      std::vector<double> s(keys.size());
      std::vector<std::vector<double>> vals(keys.size(), std::vector<double>(V));
      for (size_t i = 0; i < keys.size(); ++i) {
        const float* c = latent(t, keys[i]);
        double sc = 0;
        for (int n = 0; n < N; ++n) {
          double kn = 0;
          for (int l = 0; l < L; ++l) kn += double(W[(int64_t(h) * (N + V) + n) * L + l]) * c[l];
          sc += double(qh[n]) * kn;
        }
        for (int r = 0; r < R; ++r) sc += double(qh[N + r]) * c[L + r];
        s[i] = sc / std::sqrt(double(QD));
        for (int j = 0; j < V; ++j) {
          double v = 0;
          for (int l = 0; l < L; ++l) v += double(W[(int64_t(h) * (N + V) + N + j) * L + l]) * c[l];
          vals[i][j] = v;
        }
      }
      const double m = *std::max_element(s.begin(), s.end());
      double sum = 0;
      for (double& x : s) sum += (x = std::exp(x - m));
      for (size_t i = 0; i < keys.size(); ++i)
        for (int j = 0; j < V; ++j) o[static_cast<size_t>(h) * V + j] += s[i] / sum * vals[i][j];
    }
    return o;
  }
};

// The reference's selection on given scores: highest first, lower position on ties, returned
// as increasing positions.
std::vector<int> ref_topk(const float* scores, int visible, int k) {
  std::vector<int> pos(visible);
  std::iota(pos.begin(), pos.end(), 0);
  std::stable_sort(pos.begin(), pos.end(), [&](int a, int b) { return scores[a] > scores[b]; });
  pos.resize(std::min(visible, k));
  std::sort(pos.begin(), pos.end());
  return pos;
}

TEST(DsaOps, IndexStoreWritesLayerNormedKeysAtEachTokensPosition) {
  Fixture f;
  const int D = f.idx.head_dim;
  for (int t = 0; t < f.db.n_tokens(); ++t) {
    const float* x = f.k_raw.data() + static_cast<size_t>(t) * D;
    double mean = 0, var = 0;
    for (int i = 0; i < D; ++i) mean += x[i];
    mean /= D;
    for (int i = 0; i < D; ++i) var += (x[i] - mean) * (x[i] - mean);
    var /= D;
    const float* got = f.key(t, f.db.fb.positions[t]);
    for (int i = 0; i < D; ++i)
      EXPECT_NEAR(got[i], (x[i] - mean) / std::sqrt(var + f.eps) * f.ln_w[i] + f.ln_b[i], 1e-5) << t << " " << i;
  }
}

TEST(DsaOps, IndexScoresMatchTheReferenceOverEachCausalRange) {
  Fixture f;
  const int T = f.db.n_tokens(), C = f.db.max_positions() + 3;  // spare columns stay -inf
  Tensor scores = f.ops.alloc(T, C, DType::F32, "scores");
  f.ops.dsa_index_scores(f.q_idx, f.w_idx, f.view, f.index_kv(), f.idx, scores);
  for (int t = 0; t < T; ++t) {
    const float* st = scores.as<float>() + static_cast<int64_t>(t) * C;
    const int visible = f.db.fb.positions[t] + 1;
    for (int p = 0; p < visible; ++p) {
      const double r = f.ref_score(t, p);
      EXPECT_NEAR(st[p], r, 1e-5 * (1 + std::fabs(r))) << "token " << t << " pos " << p;
    }
    for (int p = visible; p < C; ++p) EXPECT_EQ(st[p], -std::numeric_limits<float>::infinity()) << t << " " << p;
  }
}

// The FP8 indexer-key pool (backend/dsa_index_row.h, DeepSeek-V3.2's act_quant with the
// "ue8m0" scale): each stored key is e4m3 codes of key / scale with scale a power of two and
// amax / scale in (224, 448], every value within half an e4m3 step of the F32 pool's key.
TEST(DsaOps, Fp8IndexKeysQuantiseEachKeyWithAPowerOfTwoScale) {
  Fixture f;
  const int D = f.idx.head_dim, W = dsa_fp8_row_width(D), P = kPages * kPageSize;
  Tensor pool = f.ops.alloc(P, W, DType::F8_E4M3, "fp8 keys");
  const KvLayer fp8{pool.data, DType::F8_E4M3, kPageSize, W};
  const int T = f.db.n_tokens();
  f.ops.dsa_index_store(put(f.ops, f.k_raw, T, D), put(f.ops, f.ln_w, 1, D), put(f.ops, f.ln_b, 1, D), f.eps, f.view,
                        fp8);
  for (int t = 0; t < T; ++t) {
    const uint8_t* row = static_cast<const uint8_t*>(pool.data) + f.db.row_of(t, f.db.fb.positions[t]) * W;
    float scale;
    std::memcpy(&scale, row + D, 4);
    int e = 0;
    EXPECT_EQ(std::frexp(scale, &e), 0.5f) << "token " << t << ": scale " << scale << " is not a power of two";
    const float* want = f.key(t, f.db.fb.positions[t]);
    float amax = 0;
    for (int i = 0; i < D; ++i) amax = std::max(amax, std::fabs(want[i]));
    EXPECT_GT(amax / scale, 224.0f) << t;
    EXPECT_LE(amax / scale, 448.0f) << t;
    for (int i = 0; i < D; ++i) {
      const float got = f8e4m3_to_f32(row[i]) * scale;
      // Half a step: 2^-4 of the value among normals, 2^-10 of the scale among subnormals.
      const float half_step = std::max(std::fabs(want[i]) / 16.0f, scale / 1024.0f);
      EXPECT_LE(std::fabs(got - want[i]), half_step * 1.0001f) << "token " << t << " value " << i;
    }
  }
}

// Scores over an FP8 pool are the scores of its dequantised keys (the reference formula in
// double over code * scale), and each is within the bound half an e4m3 step a key value
// allows of the F32 pool's score: sum_h |w_h| n^-1/2 sum_i |q_hi| half_step_i (ReLU is
// 1-Lipschitz). The spread itself is printed.
TEST(DsaOps, Fp8IndexScoresAreTheScoresOfTheDequantisedKeys) {
  Fixture f;
  const int D = f.idx.head_dim, H = f.idx.num_heads, W = dsa_fp8_row_width(D), P = kPages * kPageSize;
  const int T = f.db.n_tokens(), C = f.db.max_positions();
  // The F32 pool's rows (past ones and the batch's own) quantised row by row.
  Tensor pool = f.ops.alloc(P, W, DType::F8_E4M3, "fp8 keys");
  for (int r = 0; r < P; ++r)
    dsa_quantize_index_row(f.key_cache.as<float>() + static_cast<int64_t>(r) * D, D,
                           static_cast<uint8_t*>(pool.data) + static_cast<int64_t>(r) * W);
  const KvLayer fp8{pool.data, DType::F8_E4M3, kPageSize, W};
  Tensor s8 = f.ops.alloc(T, C, DType::F32, "scores"), s32 = f.ops.alloc(T, C, DType::F32, "scores");
  f.ops.dsa_index_scores(f.q_idx, f.w_idx, f.view, fp8, f.idx, s8);
  f.ops.dsa_index_scores(f.q_idx, f.w_idx, f.view, f.index_kv(), f.idx, s32);
  double worst = 0, largest = 0;
  std::vector<float> key(D);
  for (int t = 0; t < T; ++t) {
    for (int p = 0; p <= f.db.fb.positions[t]; ++p) {
      const uint8_t* row = static_cast<const uint8_t*>(pool.data) + f.db.row_of(t, p) * W;
      dsa_dequantize_index_row(row, D, key.data());
      float scale;
      std::memcpy(&scale, row + D, 4);
      double r = 0, bound = 0;
      for (int h = 0; h < H; ++h) {
        const float* qh = f.q_idx.as<float>() + (int64_t(t) * H + h) * D;
        const double wh = double(f.w_idx.as<float>()[int64_t(t) * H + h]) / std::sqrt(double(H) * D);
        double d = 0, slack = 0;
        for (int i = 0; i < D; ++i) {
          d += double(qh[i]) * key[i];
          slack += std::fabs(double(qh[i])) * std::max(std::fabs(double(f.key(t, p)[i])) / 16.0, scale / 1024.0);
        }
        r += wh * std::max(0.0, d);
        bound += std::fabs(wh) * slack;
      }
      const float got = s8.as<float>()[int64_t(t) * C + p], f32 = s32.as<float>()[int64_t(t) * C + p];
      EXPECT_NEAR(got, r, 1e-5 * (1 + std::fabs(r))) << "token " << t << " pos " << p;
      EXPECT_LE(std::fabs(double(got) - f32), bound * 1.001 + 1e-6) << "token " << t << " pos " << p;
      worst = std::max(worst, std::fabs(double(got) - f32));
      largest = std::max(largest, std::fabs(double(f32)));
    }
  }
  std::printf("fp8 indexer keys: max |score - F32 pool's| = %.3g of max |score| %.3g (%.2f%%)\n", worst, largest,
              100 * worst / largest);
}

TEST(DsaOps, TopKKeepsTheHighestScoresAndBreaksTiesByLowerPosition) {
  CpuOps ops;
  DsaBatch db;
  const BatchView view = ops.upload_batch(db.fb);
  const int T = db.n_tokens(), C = db.max_positions();
  // Small integers: many exact ties, so the tie rule decides which of them make the cut.
  std::mt19937 rng(11);
  std::vector<float> s(static_cast<size_t>(T) * C);
  for (float& x : s) x = static_cast<float>(static_cast<int>(rng() % 5));
  Tensor scores = put(ops, s, T, C);
  for (int k : {1, 3, 8, 21, 40}) {
    Tensor idx = ops.alloc(T, k, DType::I32, "indices");
    ops.dsa_topk(scores, view, idx);
    for (int t = 0; t < T; ++t) {
      const int visible = db.fb.positions[t] + 1;
      const std::vector<int> want = ref_topk(&s[static_cast<size_t>(t) * C], visible, k);
      const int32_t* got = idx.as<int32_t>() + static_cast<int64_t>(t) * k;
      for (int j = 0; j < k; ++j)
        EXPECT_EQ(got[j], j < static_cast<int>(want.size()) ? want[j] : -1) << "k " << k << " token " << t << " " << j;
    }
  }
}

TEST(DsaOps, SparseAttentionMatchesTheReferenceOverTheSelectedKeys) {
  Fixture f;
  const int T = f.db.n_tokens(), C = f.db.max_positions(), k = 5;
  Tensor scores = f.ops.alloc(T, C, DType::F32, "scores");
  f.ops.dsa_index_scores(f.q_idx, f.w_idx, f.view, f.index_kv(), f.idx, scores);
  Tensor idx = f.ops.alloc(T, k, DType::I32, "indices");
  f.ops.dsa_topk(scores, f.view, idx);
  const int HV = f.mla.num_heads * f.mla.v_dim;
  for (MlaMode mode : {MlaMode::kAuto, MlaMode::kPlain, MlaMode::kAbsorbed}) {
    Tensor o = f.ops.alloc(T, HV, DType::F32, "o");
    f.ops.mla_sparse_attention(f.q_mla, f.kv_b, f.view, f.latent_kv(), f.mla, mode, idx, o);
    for (int t = 0; t < T; ++t) {
      std::vector<int> keys;
      for (int j = 0; j < k; ++j)
        if (idx.as<int32_t>()[t * k + j] >= 0) keys.push_back(idx.as<int32_t>()[t * k + j]);
      // A query with fewer than k visible positions reads all of them (dense causal).
      EXPECT_EQ(static_cast<int>(keys.size()), std::min(k, f.db.fb.positions[t] + 1)) << t;
      const std::vector<double> want = f.ref_attention(t, keys);
      for (int j = 0; j < HV; ++j)
        EXPECT_NEAR(o.as<float>()[int64_t(t) * HV + j], want[j], 1e-4 * (1 + std::fabs(want[j])))
            << "mode " << static_cast<int>(mode) << " token " << t << " col " << j;
    }
  }
}

TEST(DsaOps, SparseAttentionWithKAtLeastTheContextIsDenseMla) {
  Fixture f;
  const int T = f.db.n_tokens(), C = f.db.max_positions(), HV = f.mla.num_heads * f.mla.v_dim;
  Tensor scores = f.ops.alloc(T, C, DType::F32, "scores");
  f.ops.dsa_index_scores(f.q_idx, f.w_idx, f.view, f.index_kv(), f.idx, scores);
  for (int k : {C, 64}) {
    Tensor idx = f.ops.alloc(T, k, DType::I32, "indices");
    f.ops.dsa_topk(scores, f.view, idx);
    for (MlaMode mode : {MlaMode::kAuto, MlaMode::kPlain, MlaMode::kAbsorbed}) {
      Tensor sparse = f.ops.alloc(T, HV, DType::F32, "sparse"), dense = f.ops.alloc(T, HV, DType::F32, "dense");
      f.ops.mla_sparse_attention(f.q_mla, f.kv_b, f.view, f.latent_kv(), f.mla, mode, idx, sparse);
      f.ops.mla_attention(f.q_mla, f.kv_b, f.view, f.latent_kv(), f.mla, mode, dense);
      for (int64_t i = 0; i < int64_t(T) * HV; ++i)
        EXPECT_NEAR(sparse.as<float>()[i], dense.as<float>()[i], 1e-6 * (1 + std::fabs(dense.as<float>()[i])))
            << "k " << k << " mode " << static_cast<int>(mode) << " at " << i;
    }
  }
}

TEST(DsaOps, SparseAttentionRefusesAFutureOrRepeatedKey) {
  Fixture f;
  const int T = f.db.n_tokens(), HV = f.mla.num_heads * f.mla.v_dim;
  Tensor idx = f.ops.alloc(T, 2, DType::I32, "indices");
  for (int t = 0; t < T; ++t) {
    idx.as<int32_t>()[2 * t] = 0;
    idx.as<int32_t>()[2 * t + 1] = f.db.fb.positions[t] + 1;  // one past the query: a future key
  }
  Tensor o = f.ops.alloc(T, HV, DType::F32, "o");
  EXPECT_DEATH(f.ops.mla_sparse_attention(f.q_mla, f.kv_b, f.view, f.latent_kv(), f.mla, MlaMode::kAbsorbed, idx, o),
               "causal");
  for (int t = 0; t < T; ++t) idx.as<int32_t>()[2 * t + 1] = 0;  // the same key twice
  EXPECT_DEATH(f.ops.mla_sparse_attention(f.q_mla, f.kv_b, f.view, f.latent_kv(), f.mla, MlaMode::kAbsorbed, idx, o),
               "distinct");
}

}  // namespace
}  // namespace moonrun::cpu
