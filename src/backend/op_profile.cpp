#include "backend/op_profile.h"

#include <algorithm>
#include <chrono>
#include <unordered_set>

namespace moonrun {

void OpProfile::add(const std::string& op, double seconds, double bytes, double flops) {
  OpStat& s = stats_[op];
  s.op = op;
  s.calls += 1;
  s.seconds += seconds;
  s.bytes += bytes;
  s.flops += flops;
}

std::vector<OpStat> OpProfile::sorted() const {
  std::vector<OpStat> v;
  for (const auto& [name, s] : stats_) v.push_back(s);
  std::sort(v.begin(), v.end(), [](const OpStat& a, const OpStat& b) { return a.seconds > b.seconds; });
  return v;
}

double OpProfile::total_seconds() const {
  double t = 0;
  for (const auto& [name, s] : stats_) t += s.seconds;
  return t;
}

namespace {

double bytes_of(const Tensor& t) { return static_cast<double>(t.nbytes()); }
double bytes_of(const Matrix& m) { return bytes_of(m.w) + (m.kind() != WeightFormat::dense ? bytes_of(m.scales) : 0.0); }

std::string matrix_label(const char* op, const Matrix& m) {
  return std::string(op) + " [" + std::to_string(m.out) + " x " + std::to_string(m.in) + "] " +
         (m.mxfp4() ? "mxfp4" : m.int4() ? "int4" : dtype_name(m.w.dtype));
}

// Prefill (several new tokens in a sequence) and decode run different kernels: keep apart.
const char* phase(const BatchView& b) { return b.n_tokens() == b.n_seqs() ? "decode" : "prefill"; }

}  // namespace

template <class Fn>
void ProfiledOps::timed(const std::string& op, double bytes, double flops, Fn&& fn) {
  in_.synchronize();
  const auto t0 = std::chrono::steady_clock::now();
  fn();
  in_.synchronize();
  profile_.add(op, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), bytes, flops);
}

void ProfiledOps::zero(const Tensor& t) {
  timed("zero", bytes_of(t), 0, [&] { in_.zero(t); });
}
void ProfiledOps::copy(const Tensor& src, const Tensor& dst) {
  timed("copy", bytes_of(src) + bytes_of(dst), 0, [&] { in_.copy(src, dst); });
}

void ProfiledOps::embedding(const Tensor& table, int64_t first_row, const BatchView& batch, Tensor out) {
  // One table row per token, not the table.
  const double rows = static_cast<double>(batch.n_tokens()) * table.cols * dtype_size_bytes(table.dtype);
  timed("embedding", rows + bytes_of(out), 0, [&] { in_.embedding(table, first_row, batch, out); });
}
void ProfiledOps::rmsnorm(const Tensor& x, const Tensor& w, float eps, Tensor y) {
  timed("rmsnorm", bytes_of(x) + bytes_of(w) + bytes_of(y), 0, [&] { in_.rmsnorm(x, w, eps, y); });
}
void ProfiledOps::linear(const Tensor& x, const Matrix& w, Tensor y) {
  const double flops = 2.0 * static_cast<double>(x.rows) * w.out * w.in;
  timed(matrix_label("linear", w), bytes_of(w) + bytes_of(x) + bytes_of(y), flops, [&] { in_.linear(x, w, y); });
}
void ProfiledOps::linear_shared_input(const Tensor& x, std::span<const Matrix* const> ws,
                                      std::span<const Tensor> ys) {
  if (ws.empty()) return;
  double bytes = bytes_of(x), flops = 0;
  for (size_t i = 0; i < ws.size(); ++i) {
    bytes += bytes_of(*ws[i]) + bytes_of(ys[i]);
    flops += 2.0 * static_cast<double>(x.rows) * ws[i]->out * ws[i]->in;
  }
  const std::string label = "linear x" + std::to_string(ws.size());
  timed(matrix_label(label.c_str(), *ws[0]), bytes, flops,
        [&] { in_.linear_shared_input(x, ws, ys); });
}
void ProfiledOps::add(const Tensor& a, const Tensor& b, Tensor y) {
  timed("add", bytes_of(a) + bytes_of(b) + bytes_of(y), 0, [&] { in_.add(a, b, y); });
}
void ProfiledOps::mul(const Tensor& a, const Tensor& b, Tensor y) {
  timed("mul", bytes_of(a) + bytes_of(b) + bytes_of(y), 0, [&] { in_.mul(a, b, y); });
}
void ProfiledOps::gated_activation(const Tensor& gate, const Tensor& up, const ActivationParams& act, Tensor y) {
  timed("gated_activation", bytes_of(gate) + bytes_of(up) + bytes_of(y), 0,
        [&] { in_.gated_activation(gate, up, act, y); });
}
void ProfiledOps::attn_res_mix(const Tensor& prefix, const Tensor& blocks, int n_blocks, const Tensor& w_norm,
                               const Tensor& w_proj, float eps, Tensor out) {
  timed("attn_res_mix", bytes_of(prefix) + bytes_of(blocks) + bytes_of(out), 0,
        [&] { in_.attn_res_mix(prefix, blocks, n_blocks, w_norm, w_proj, eps, out); });
}
void ProfiledOps::copy_many(std::span<const Tensor> src, std::span<const Tensor> dst) {
  double bytes = 0;
  for (size_t i = 0; i < src.size(); ++i) bytes += bytes_of(src[i]) + bytes_of(dst[i]);
  timed("copy_many", bytes, 0, [&] { in_.copy_many(src, dst); });
}
void ProfiledOps::gather_rows(const Tensor& x, const int32_t* rows, Tensor y) {
  timed("gather_rows", 2 * bytes_of(y), 0, [&] { in_.gather_rows(x, rows, y); });
}
void ProfiledOps::gelu(const Tensor& x, bool tanh_approx, Tensor y) {
  timed(tanh_approx ? "gelu_tanh" : "gelu", bytes_of(x) + bytes_of(y), 0, [&] { in_.gelu(x, tanh_approx, y); });
}
void ProfiledOps::vision_attention(const Tensor& qkv, const Tensor& rope, std::span<const int32_t> seq_starts,
                                   int num_heads, int head_dim, Tensor out) {
  // Each image's rows attend to each other: 2 * n^2 * H * d multiply-adds for scores and values.
  double flops = 0;
  for (size_t s = 0; s + 1 < seq_starts.size(); ++s) {
    const double n = seq_starts[s + 1] - seq_starts[s];
    flops += 4.0 * n * n * num_heads * head_dim;
  }
  timed("vision_attention", bytes_of(qkv) + bytes_of(rope) + bytes_of(out), flops,
        [&] { in_.vision_attention(qkv, rope, seq_starts, num_heads, head_dim, out); });
}
void ProfiledOps::short_conv(const Tensor& x, const Tensor& weight, const BatchView& batch, StateLayer window,
                             bool silu, Tensor y) {
  // The window of K-1 rows per sequence is read and written back.
  const double window_bytes = 2.0 * batch.n_seqs() * (weight.cols - 1) * weight.rows * sizeof(float);
  timed(std::string("short_conv (") + phase(batch) + ")", bytes_of(x) + bytes_of(y) + bytes_of(weight) + window_bytes,
        0, [&] { in_.short_conv(x, weight, batch, window, silu, y); });
}
void ProfiledOps::kda_replay_inputs(const KdaReplayInputs& r, const BatchView& batch) {
  double bytes = 0;  // the gathered rows read, the outputs written, the windows read and written
  for (int i = 0; i < 5; ++i) bytes += 2 * bytes_of(r.out[i]);
  for (int i = 0; i < 3; ++i) bytes += bytes_of(r.conv[i]) + 2.0 * batch.n_seqs() * (r.conv[i].cols - 1) * r.conv[i].rows * 4;
  timed("kda_replay_inputs", bytes, 0, [&] { in_.kda_replay_inputs(r, batch); });
}
void ProfiledOps::l2norm_rows(Tensor x, float scale) {
  timed("l2norm_rows", 2 * bytes_of(x), 0, [&] { in_.l2norm_rows(x, scale); });
}
void ProfiledOps::kda_gate(Tensor g, const Tensor& A_log, const Tensor& dt_bias, int head_dim, float lower_bound) {
  timed("kda_gate", 2 * bytes_of(g), 0, [&] { in_.kda_gate(g, A_log, dt_bias, head_dim, lower_bound); });
}
void ProfiledOps::sigmoid(Tensor x) {
  timed("sigmoid", 2 * bytes_of(x), 0, [&] { in_.sigmoid(x); });
}
void ProfiledOps::rope_interleaved(Tensor x, const Tensor& cos_sin, int n_heads, int head_width, int rope_offset) {
  timed("rope_interleaved", 2 * bytes_of(x) + bytes_of(cos_sin), 0,
        [&] { in_.rope_interleaved(x, cos_sin, n_heads, head_width, rope_offset); });
}
void ProfiledOps::kda_recurrence(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                                 const Tensor& beta, const BatchView& batch, StateLayer state, int num_heads,
                                 int head_dim, KdaMode mode, Tensor o) {
  // Each sequence's fp32 state [H, d, d] is read once and written once.
  const double state_bytes = 2.0 * batch.n_seqs() * num_heads * head_dim * head_dim * sizeof(float);
  const double io = bytes_of(q) + bytes_of(k) + bytes_of(v) + bytes_of(g) + bytes_of(beta) + bytes_of(o);
  // Per token and head: decay, k^T S, the rank-1 update and S^T q, about 4 d^2 multiply-adds.
  const double flops = 8.0 * q.rows * num_heads * head_dim * head_dim;
  timed(std::string("kda_recurrence (") + phase(batch) + ")", state_bytes + io, flops,
        [&] { in_.kda_recurrence(q, k, v, g, beta, batch, state, num_heads, head_dim, mode, o); });
}
void ProfiledOps::gated_rmsnorm(const Tensor& o, const Tensor& gate, const Tensor& w, float eps, Tensor y) {
  timed("gated_rmsnorm", bytes_of(o) + bytes_of(gate) + bytes_of(y), 0, [&] { in_.gated_rmsnorm(o, gate, w, eps, y); });
}
void ProfiledOps::mla_store(const Tensor& ckv, const Tensor& norm_w, float eps, const BatchView& batch,
                            KvLayer cache) {
  const double rows = static_cast<double>(batch.n_tokens()) * cache.row_width * dtype_size_bytes(cache.dtype);
  timed("mla_store", bytes_of(ckv) + rows, 0, [&] { in_.mla_store(ckv, norm_w, eps, batch, cache); });
}
void ProfiledOps::mla_attention(const Tensor& q, const Matrix& kv_b, const BatchView& batch, KvLayer cache,
                                const MlaShape& shape, MlaMode mode, Tensor o) {
  // Every cached row of each sequence is read once (all heads share the latent row).
  double rows = 0, score_pairs = 0;
  for (const BatchSeq& s : batch.host->seqs) {
    rows += s.n_past + s.n_new;
    score_pairs += static_cast<double>(s.n_new) * (s.n_past + (s.n_new + 1) / 2.0);
  }
  const double cache_bytes = rows * cache.row_width * dtype_size_bytes(cache.dtype);
  // Scores and values per (query, key) pair and head: (nope + rope + v) multiply-adds.
  const double flops = 2.0 * score_pairs * shape.num_heads * (shape.nope + shape.rope + shape.v_dim);
  timed(std::string("mla_attention (") + phase(batch) + ")", cache_bytes + bytes_of(kv_b) + bytes_of(q) + bytes_of(o),
        flops, [&] { in_.mla_attention(q, kv_b, batch, cache, shape, mode, o); });
}
// The DSA ops are timed by bytes of their tensors only: their cost models come with the
// CUDA kernels (issue 38, item 3).
void ProfiledOps::dsa_index_store(const Tensor& k, const Tensor& norm_w, const Tensor& norm_b, float eps,
                                  const BatchView& batch, KvLayer cache) {
  timed("dsa_index_store", 2.0 * bytes_of(k), 0, [&] { in_.dsa_index_store(k, norm_w, norm_b, eps, batch, cache); });
}
void ProfiledOps::dsa_index_scores(const Tensor& q, const Tensor& weights, const BatchView& batch, KvLayer cache,
                                   const DsaIndexerShape& shape, Tensor scores, int first_token) {
  timed(std::string("dsa_index_scores (") + phase(batch) + ")", bytes_of(q) + bytes_of(weights) + bytes_of(scores), 0,
        [&] { in_.dsa_index_scores(q, weights, batch, cache, shape, scores, first_token); });
}
void ProfiledOps::dsa_topk(const Tensor& scores, const BatchView& batch, Tensor indices, int first_token) {
  timed("dsa_topk", bytes_of(scores) + bytes_of(indices), 0,
        [&] { in_.dsa_topk(scores, batch, indices, first_token); });
}
void ProfiledOps::mla_sparse_attention(const Tensor& q, const Matrix& kv_b, const BatchView& batch, KvLayer cache,
                                       const MlaShape& shape, MlaMode mode, const Tensor& indices, Tensor o) {
  timed(std::string("mla_sparse_attention (") + phase(batch) + ")",
        bytes_of(q) + bytes_of(kv_b) + bytes_of(indices) + bytes_of(o), 0,
        [&] { in_.mla_sparse_attention(q, kv_b, batch, cache, shape, mode, indices, o); });
}
void ProfiledOps::router_topk(const Tensor& logits, const Tensor& bias, const RouterParams& p, Tensor ids,
                              Tensor weights) {
  timed("router_topk", bytes_of(logits) + bytes_of(ids) + bytes_of(weights), 0,
        [&] { in_.router_topk(logits, bias, p, ids, weights); });
}
void ProfiledOps::moe_experts(const Tensor& x, const Tensor& ids, const Tensor& weights, const ExpertMatrices& w1,
                              const ExpertMatrices& w3, const ExpertMatrices& w2, const ActivationParams& act,
                              Tensor y) {
  // The experts this batch touches are read once each: count them from the routing.
  std::vector<int32_t> host(static_cast<size_t>(ids.numel()));
  in_.download(ids, host.data());
  std::unordered_set<int32_t> distinct;
  int64_t assignments = 0;
  for (int32_t e : host) {
    if (e < w1.first_expert || e >= w1.first_expert + w1.num_experts) continue;
    distinct.insert(e);
    ++assignments;
  }
  const double per_expert = (bytes_of(w1.stacked) + bytes_of(w3.stacked) + bytes_of(w2.stacked)) /
                            std::max(1, w1.num_experts);
  const double macs_per_row = static_cast<double>(w1.stacked.out) * w1.stacked.in +
                              static_cast<double>(w3.stacked.out) * w3.stacked.in +
                              static_cast<double>(w2.stacked.out) * w2.stacked.in;
  const std::string label = std::string("moe_experts [") + std::to_string(w1.num_experts) + " x " +
                            std::to_string(w1.stacked.out) + " x " + std::to_string(w1.stacked.in) + "] " +
                            (w1.stacked.mxfp4() ? "mxfp4" : w1.stacked.int4() ? "int4" : dtype_name(w1.stacked.w.dtype));
  timed(label, distinct.size() * per_expert + bytes_of(x) + bytes_of(y), 2.0 * assignments * macs_per_row,
        [&] { in_.moe_experts(x, ids, weights, w1, w3, w2, act, y); });
}
void ProfiledOps::dspark_markov(Tensor logits, const Tensor& w1, const Tensor& w2, const int32_t* ids, int block,
                                int n_slots, const Tensor& h, const Tensor& conf_w, float conf_b, Tensor tokens,
                                Tensor conf) {
  // Per slot: w2 read (from cache after the first), the row read and written.
  const double slots = static_cast<double>(logits.rows / std::max(block, 1)) * n_slots;
  timed("dspark_markov", static_cast<double>(bytes_of(w2)) + slots * 2.0 * logits.cols * sizeof(float),
        slots * 2.0 * static_cast<double>(w2.numel()),
        [&] { in_.dspark_markov(logits, w1, w2, ids, block, n_slots, h, conf_w, conf_b, tokens, conf); });
}
void ProfiledOps::sample(const Tensor& logits, const SamplingBatch& rows, std::vector<SampleResult>& out) {
  timed("sample", bytes_of(logits), 0, [&] { in_.sample(logits, rows, out); });
}
void ProfiledOps::all_reduce_sum(Tensor x) {
  timed("all_reduce_sum", bytes_of(x), 0, [&] { in_.all_reduce_sum(x); });
}
void ProfiledOps::all_gather_cols(const Tensor& x, Tensor out) {
  timed("all_gather_cols", bytes_of(out), 0, [&] { in_.all_gather_cols(x, out); });
}
void ProfiledOps::all_gather_cols_packed(std::span<const Tensor> parts, std::span<Tensor> outs) {
  double bytes = 0;
  for (const Tensor& o : outs) bytes += bytes_of(o);
  // One collective, counted as one all_gather_cols (what the plan counts).
  timed("all_gather_cols", bytes, 0, [&] { in_.all_gather_cols_packed(parts, outs); });
}

}  // namespace moonrun
