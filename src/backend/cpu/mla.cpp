// MLA attention on the CPU, float32 (the reference is modeling_kimi_linear.py
// KimiMLAAttention with eager attention; the math is in mla.h).
#include "backend/cpu/mla.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <thread>

#include "common/check.h"

namespace moonrun::cpu {

namespace {

// In-place softmax over n scores (max-subtracted, fp32 as the reference's softmax dtype).
void softmax_inplace(float* s, int n) {
  float m = s[0];
  for (int i = 1; i < n; ++i) m = std::max(m, s[i]);
  float sum = 0;
  for (int i = 0; i < n; ++i) {
    s[i] = std::exp(s[i] - m);
    sum += s[i];
  }
  const float inv = 1.0f / sum;
  for (int i = 0; i < n; ++i) s[i] *= inv;
}

// q_lat = W_uk_h^T q_nope: the query of head h folded into the latent space.
void fold_query(const float* qt, const float* W_uk, int N, int L, float* q_lat) {
  std::fill(q_lat, q_lat + L, 0.0f);
  for (int n = 0; n < N; ++n) {
    const float qn = qt[n];
    const float* wr = W_uk + static_cast<int64_t>(n) * L;
    for (int l = 0; l < L; ++l) q_lat[l] += qn * wr[l];
  }
}

// mla_attend_absorbed over S key ranges a query (mla.h): partials in parallel over (head,
// range), then each (token, head) combined in range order.
void attend_absorbed_split(const float* q, const float* kv_b, const MlaShape& shape, int n_tokens, int n_past,
                           const float* const* rows, float* o, int S) {
  const int H = shape.num_heads, L = shape.kv_lora, R = shape.rope;
  const int N = shape.nope, V = shape.v_dim, QD = N + R, KV = N + V;
  const float scale = 1.0f / std::sqrt(static_cast<float>(QD));
  // Per (token, head, range): [m, l, acc[L]].
  const int64_t part = L + 2;
  std::vector<float> parts(static_cast<size_t>(n_tokens) * H * S * part);
  std::vector<float> q_lats(static_cast<size_t>(n_tokens) * H * L);
  parallel_heads(H, static_cast<int64_t>(n_tokens) * N * L, [&](int h) {
    const float* W_uk = kv_b + static_cast<int64_t>(h) * KV * L;
    for (int t = 0; t < n_tokens; ++t)
      fold_query(q + (static_cast<int64_t>(t) * H + h) * QD, W_uk, N, L, q_lats.data() + (static_cast<int64_t>(t) * H + h) * L);
  });
  const int64_t P = n_past + n_tokens;
  parallel_heads(H * S, static_cast<int64_t>(n_tokens) * (P / S + 1) * (L + R), [&](int item) {
    const int h = item / S, r = item % S;
    std::vector<float> scores;
    for (int t = 0; t < n_tokens; ++t) {
      const int n_keys = n_past + t + 1;
      const int begin = static_cast<int>(static_cast<int64_t>(n_keys) * r / S);
      const int end = static_cast<int>(static_cast<int64_t>(n_keys) * (r + 1) / S);
      float* pr = parts.data() + ((static_cast<int64_t>(t) * H + h) * S + r) * part;
      float* acc = pr + 2;
      std::fill(acc, acc + L, 0.0f);
      if (begin == end) {  // fewer keys than ranges: an empty range weighs nothing
        pr[0] = -std::numeric_limits<float>::infinity();
        pr[1] = 0.0f;
        continue;
      }
      const float* qt = q + (static_cast<int64_t>(t) * H + h) * QD;
      const float* q_lat = q_lats.data() + (static_cast<int64_t>(t) * H + h) * L;
      scores.resize(static_cast<size_t>(end - begin));
      float m = -std::numeric_limits<float>::infinity();
      for (int i = begin; i < end; ++i) {
        scores[i - begin] = (dot(q_lat, rows[i], L) + dot(qt + N, rows[i] + L, R)) * scale;
        m = std::max(m, scores[i - begin]);
      }
      float l = 0.0f;
      for (int i = begin; i < end; ++i) {
        const float p = std::exp(scores[i - begin] - m);
        l += p;
        const float* row = rows[i];
        for (int j = 0; j < L; ++j) acc[j] += p * row[j];
      }
      pr[0] = m;
      pr[1] = l;
    }
  });
  parallel_heads(H, static_cast<int64_t>(n_tokens) * S * L, [&](int h) {
    const float* W_uv = kv_b + static_cast<int64_t>(h) * KV * L + static_cast<int64_t>(N) * L;
    std::vector<float> o_lat(L);
    for (int t = 0; t < n_tokens; ++t) {
      const float* pt = parts.data() + (static_cast<int64_t>(t) * H + h) * S * part;
      float M = -std::numeric_limits<float>::infinity();
      for (int r = 0; r < S; ++r) M = std::max(M, pt[r * part]);
      std::fill(o_lat.begin(), o_lat.end(), 0.0f);
      float denom = 0.0f;
      for (int r = 0; r < S; ++r) {
        const float* pr = pt + r * part;
        if (pr[1] == 0.0f) continue;
        const float w = std::exp(pr[0] - M);
        denom += w * pr[1];
        for (int j = 0; j < L; ++j) o_lat[j] += w * pr[2 + j];
      }
      const float inv = 1.0f / denom;
      for (int j = 0; j < L; ++j) o_lat[j] *= inv;
      float* ot = o + (static_cast<int64_t>(t) * H + h) * V;
      for (int j = 0; j < V; ++j) ot[j] = dot(W_uv + static_cast<int64_t>(j) * L, o_lat.data(), L);
    }
  });
}

}  // namespace

// Attention with per-head keys and values expanded from the latent rows.
void mla_attend_plain(const float* q, const float* kv_b, const MlaShape& shape, int n_tokens, int n_past,
                      const float* const* rows, float* o, const int32_t* selected, int selected_cols) {
  const int H = shape.num_heads, L = shape.kv_lora, R = shape.rope;
  const int N = shape.nope, V = shape.v_dim, QD = N + R;
  const int P = n_past + n_tokens;
  const int KV = N + V;  // kv_b output per head
  const float scale = 1.0f / std::sqrt(static_cast<float>(QD));
  // Every visible latent row through kv_b: [P, H, nope | v].
  std::vector<float> latents(static_cast<size_t>(P) * L);
  for (int p = 0; p < P; ++p) std::copy(rows[p], rows[p] + L, &latents[static_cast<size_t>(p) * L]);
  std::vector<float> kv(static_cast<size_t>(P) * H * KV);
  matmul_xwT(latents.data(), P, L, kv_b, H * KV, kv.data());
  parallel_heads(H, static_cast<int64_t>(n_tokens) * P * (QD + V), [&](int h) {
    // The head's keys transposed [QD][P] and values [P][V], each contiguous: a query's scores
    // are QD passes over contiguous positions (vectorised across positions; each score is
    // still the sum over its dims in order, nope then rope) and its output the weighted sum
    // of the values in position order. Queries go in blocks and positions in tiles, so a
    // tile of keys and values is read from cache by every query of the block: long prompts
    // (32k positions in CI) would otherwise stream the whole prefix from memory per query.
    constexpr int kQueries = 32, kTile = 512;
    std::vector<float> keys_t(static_cast<size_t>(QD) * P), vals(static_cast<size_t>(P) * V);
    for (int p = 0; p < P; ++p) {
      const float* kn = &kv[(static_cast<size_t>(p) * H + h) * KV];
      for (int d = 0; d < N; ++d) keys_t[static_cast<size_t>(d) * P + p] = kn[d];
      for (int d = 0; d < R; ++d) keys_t[static_cast<size_t>(N + d) * P + p] = rows[p][L + d];
      std::copy(kn + N, kn + KV, &vals[static_cast<size_t>(p) * V]);
    }
    std::vector<float> scores(static_cast<size_t>(kQueries) * P);
    std::vector<char> kept(selected ? P : 0);
    for (int t0 = 0; t0 < n_tokens; t0 += kQueries) {
      const int nq = std::min(kQueries, n_tokens - t0);
      const int last = n_past + t0 + nq;  // the block's last query sees positions [0, last)
      for (int p0 = 0; p0 < last; p0 += kTile) {
        for (int i = 0; i < nq; ++i) {
          const int visible = n_past + t0 + i + 1;  // causal: positions 0 .. n_past + t
          const int pn = std::min(kTile, visible - p0);
          if (pn <= 0) continue;
          const float* qt = q + (static_cast<int64_t>(t0 + i) * H + h) * QD;
          float* srow = &scores[static_cast<size_t>(i) * P + p0];
          std::fill(srow, srow + pn, 0.0f);
          for (int d = 0; d < QD; ++d) {
            const float qd = qt[d];
            const float* kd = &keys_t[static_cast<size_t>(d) * P + p0];
            for (int p = 0; p < pn; ++p) srow[p] += qd * kd[p];
          }
        }
      }
      for (int i = 0; i < nq; ++i) {
        const int visible = n_past + t0 + i + 1;
        float* srow = &scores[static_cast<size_t>(i) * P];
        for (int p = 0; p < visible; ++p) srow[p] *= scale;
        if (selected) {
          // The reference's index mask: unselected scores become -inf before the softmax, so
          // they take weight 0 (the query's causal range always holds a selected position).
          const int32_t* sel = selected + static_cast<int64_t>(t0 + i) * selected_cols;
          std::fill(kept.begin(), kept.begin() + visible, 0);
          for (int j = 0; j < selected_cols && sel[j] >= 0; ++j) kept[sel[j]] = 1;
          for (int p = 0; p < visible; ++p)
            if (!kept[p]) srow[p] = -std::numeric_limits<float>::infinity();
        }
        softmax_inplace(srow, visible);
        float* ot = o + (static_cast<int64_t>(t0 + i) * H + h) * V;
        std::fill(ot, ot + V, 0.0f);
      }
      for (int p0 = 0; p0 < last; p0 += kTile) {
        for (int i = 0; i < nq; ++i) {
          const int pn = std::min(kTile, n_past + t0 + i + 1 - p0);
          const float* srow = &scores[static_cast<size_t>(i) * P + p0];
          float* ot = o + (static_cast<int64_t>(t0 + i) * H + h) * V;
          for (int p = 0; p < pn; ++p) {
            const float a = srow[p];
            const float* vp = &vals[static_cast<size_t>(p0 + p) * V];
            for (int j = 0; j < V; ++j) ot[j] += a * vp[j];
          }
        }
      }
    }
  });
}

// The same attention with kv_b absorbed: multi-query attention over the latent rows.
void mla_attend_absorbed(const float* q, const float* kv_b, const MlaShape& shape, int n_tokens, int n_past,
                         const float* const* rows, float* o, const int32_t* selected, int selected_cols,
                         int kv_splits) {
  const int H = shape.num_heads, L = shape.kv_lora, R = shape.rope;
  const int N = shape.nope, V = shape.v_dim, QD = N + R;
  const int P = n_past + n_tokens;
  const int KV = N + V;
  const float scale = 1.0f / std::sqrt(static_cast<float>(QD));
  if (kv_splits > 1 && !selected) return attend_absorbed_split(q, kv_b, shape, n_tokens, n_past, rows, o, kv_splits);
  parallel_heads(H, static_cast<int64_t>(n_tokens) * (P * (L + R) + (N + V) * L), [&](int h) {
    const float* W_uk = kv_b + static_cast<int64_t>(h) * KV * L;  // [nope, kv_lora]
    const float* W_uv = W_uk + static_cast<int64_t>(N) * L;       // [v, kv_lora]
    std::vector<float> q_lat(L), o_lat(L), scores(P);
    for (int t = 0; t < n_tokens; ++t) {
      const float* qt = q + (static_cast<int64_t>(t) * H + h) * QD;
      fold_query(qt, W_uk, N, L, q_lat.data());
      // The keys this query reads: its causal range, or its selection (positions, then -1s).
      const int32_t* sel = selected ? selected + static_cast<int64_t>(t) * selected_cols : nullptr;
      int n_keys = n_past + t + 1;
      if (sel) {
        n_keys = 0;
        while (n_keys < selected_cols && sel[n_keys] >= 0) ++n_keys;
      }
      auto key_row = [&](int i) { return rows[sel ? sel[i] : i]; };
      for (int i = 0; i < n_keys; ++i)
        scores[i] = (dot(q_lat.data(), key_row(i), L) + dot(qt + N, key_row(i) + L, R)) * scale;
      softmax_inplace(scores.data(), n_keys);
      std::fill(o_lat.begin(), o_lat.end(), 0.0f);
      for (int i = 0; i < n_keys; ++i) {
        const float a = scores[i];
        const float* row = key_row(i);
        for (int l = 0; l < L; ++l) o_lat[l] += a * row[l];
      }
      // o = W_uv o_lat
      float* ot = o + (static_cast<int64_t>(t) * H + h) * V;
      for (int j = 0; j < V; ++j) ot[j] = dot(W_uv + static_cast<int64_t>(j) * L, o_lat.data(), L);
    }
  });
}

}  // namespace moonrun::cpu
