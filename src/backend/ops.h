#pragma once
// The ops the models are written against, and nothing else: one interface, two
// implementations. backend/cpu/ is the float32 reference (the executable specification);
// backend/cuda/ runs the same ops on a GPU and is tested op by op against it
// (tests/backend/). A model (model/kimi_k3.cpp) calls only these, so it is written once.
//
// Conventions. Every op enqueues on the backend's one stream, in order, so a temporary may
// be reused as soon as the op that reads it was issued. Tensors are backend memory
// (backend/tensor.h). The residual stream, router logits, attention internals and logits
// are F32; the inputs of projections are act_dtype() (BF16 on a bf16 GPU, F32 otherwise).
// Shapes are given as [rows, cols] with T = batch.n_tokens().
//
// Failures inside an op (a CUDA error, a full device) throw BackendError; the runner, the
// only caller, turns it into a Status. After one, the backend's state is unknown.
#include <cstddef>
#include <cstdint>
#include <climits>
#include <cmath>
#include <functional>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "backend/batch.h"
#include "backend/comm.h"
#include "backend/sampling.h"
#include "backend/tensor.h"

namespace moonrun {

class BackendError : public std::runtime_error {
 public:
  explicit BackendError(const std::string& what) : std::runtime_error(what) {}
};

// The gated MLP activation (K3_SPEC.md §2): SiTU in K3, SwiGLU in Kimi Linear.
struct ActivationParams {
  bool situ = true;           // false: SwiGLU (silu(g) * u)
  float beta = 4.0f;          // activation_situ_beta
  float linear_beta = 25.0f;  // activation_situ_linear_beta (0: u passes through)
};

// The MoE router rule (K3_SPEC.md §2, DeepSeek-V3 "noaux_tc").
struct RouterParams {
  int num_experts = 0;
  int top_k = 0;
  int num_expert_group = 1;
  int topk_group = 1;
  bool renormalize = true;
  float routed_scaling_factor = 1.0f;
};

// Which evaluation order the recurrent / attention ops use. kAuto is the reference's
// choice per sequence (one new token: recurrent KDA / absorbed MLA; several: chunked KDA /
// plain MLA); tests pin the others to check the orders against each other.
enum class KdaMode { kAuto, kRecurrent, kChunked };
enum class MlaMode { kAuto, kPlain, kAbsorbed };

// MLA's attention geometry (K3: 96 heads, kv_lora 512, nope 128, rope 64, v 128).
struct MlaShape {
  int num_heads = 0;
  int kv_lora = 0;
  int nope = 0;
  int rope = 0;
  int v_dim = 0;
  int row_width() const { return kv_lora + rope; }  // one cache row
};

// Plain-order MLA (prefill) attends to a chunk's cached prefix a block of keys at a time,
// expanding kv_b over one block only, so a chunk needs the same memory after 1M cached tokens
// as after none: the block holds at least the chunk's own tokens (its causal part is one
// block) and 8,192 keys otherwise. Model::scratch_bytes sizes the step's scratch with it.
inline int mla_prefill_key_block(int n_new_tokens) {
  return n_new_tokens > 8192 ? (n_new_tokens + 127) / 128 * 128 : 8192;
}

// The lightning indexer of DeepSeek Sparse Attention (Kimi K3.1: 32 heads x 128, no RoPE;
// model/kimi_k31.h). One key head per token (MQA), cached beside the latent rows.
struct DsaIndexerShape {
  int num_heads = 0;
  int head_dim = 0;
  // The reference's scale on the per-head weights (DeepSeek-V3.2-Exp Indexer:
  // weights_proj(x) * n_heads^-1/2 * softmax_scale, softmax_scale = head_dim^-1/2).
  float weight_scale() const { return static_cast<float>(1.0 / std::sqrt(static_cast<double>(num_heads) * head_dim)); }
};

class Ops {
 public:
  virtual ~Ops() = default;
  virtual const char* name() const = 0;  // "cpu", "cuda"
  // The dtype of projection inputs and of dense weights as this backend keeps them.
  virtual DType act_dtype() const = 0;
  virtual DType weight_dtype() const = 0;

  // ---- memory ------------------------------------------------------------------------
  // Long-lived memory (weights, cache pools), zero-filled. Throws BackendError naming
  // `what` and the sizes when the device is full.
  virtual Tensor alloc(int64_t rows, int64_t cols, DType dtype, const char* what) = 0;
  // Bytes of long-lived memory handed out so far, and how many more alloc() can give
  // (a device's arena; the CPU backend answers INT64_MAX: its pools are sized from RAM).
  virtual size_t allocated_bytes() const = 0;
  virtual int64_t free_bytes() const { return INT64_MAX; }
  // Host bytes -> t at offset_bytes (synchronous for the host buffer: it may be reused).
  virtual void upload(const Tensor& t, size_t offset_bytes, const void* host, size_t bytes) = 0;
  // t -> host (waits for the stream).
  virtual void download(const Tensor& t, void* host) = 0;
  virtual void zero(const Tensor& t) = 0;
  virtual void copy(const Tensor& src, const Tensor& dst) = 0;  // same shape; F32 <-> act dtype allowed
  // dst[:, dst_col + j] = src[:, src_col + j] for j < n_cols, every row: a column block
  // between two tensors of the same rows and dtype (a rank's slice of a row-parallel input).
  virtual void copy_cols(const Tensor& src, int64_t src_col, const Tensor& dst, int64_t dst_col, int64_t n_cols) = 0;
  // Per-step temporaries: a bump allocator the runner resets every step (reset_scratch),
  // with mark/rewind for a layer's temporaries. Same sequence of requests -> same addresses
  // (what lets a captured CUDA graph be replayed).
  virtual Tensor scratch(int64_t rows, int64_t cols, DType dtype) = 0;
  virtual size_t scratch_mark() const = 0;
  virtual void scratch_rewind(size_t mark) = 0;
  virtual void reset_scratch() = 0;

  // ---- the batch ---------------------------------------------------------------------
  // Copies the batch's tables into backend memory (once per step). A backend that stages
  // the copy keeps one staging area per `area` (kBatchAreas): a second batch uploaded into
  // another area before the first one's copy ran leaves the first intact (the speculative
  // state replay and the step that follows it, both inside captured graphs).
  static constexpr int kBatchAreas = 2;
  virtual BatchView upload_batch(const ForwardBatch& batch, int area = 0) = 0;

  // ---- dense per-token ops -----------------------------------------------------------
  // out[t] = table[token_ids[t] - first_row] for the ids this table holds, zero for the
  // others; table [rows, hidden] (weight dtype) holds vocabulary rows [first_row,
  // first_row + rows) (all of it at one rank; a vocab-parallel rank's slice otherwise),
  // out [T, hidden] F32.
  virtual void embedding(const Tensor& table, int64_t first_row, const BatchView& batch, Tensor out) = 0;
  // y = w * (x / sqrt(mean(x^2) + eps)) per row, fp32 math; x F32; y F32 or act dtype (may alias x when F32).
  virtual void rmsnorm(const Tensor& x, const Tensor& w, float eps, Tensor y) = 0;
  // y = x W^T; x act dtype (or F32 with an F32 weight), y F32 or act dtype.
  virtual void linear(const Tensor& x, const Matrix& w, Tensor y) = 0;
  // ys[i] = x W_i^T for several projections of one input (a KDA layer's q, k, v and output
  // gate). The default is linear() for each; a backend may run them as one call when the
  // matrices share a shape and lie back to back in memory (as the loader places a KDA
  // layer's four) and the outputs do too (CUDA: one strided-batched cuBLASLt GEMM).
  virtual void linear_shared_input(const Tensor& x, std::span<const Matrix* const> ws, std::span<const Tensor> ys) {
    for (size_t i = 0; i < ws.size(); ++i) linear(x, *ws[i], ys[i]);
  }
  virtual void add(const Tensor& a, const Tensor& b, Tensor y) = 0;  // F32; y may alias a or b
  // y = a * b elementwise; a, b F32; y F32 or act dtype (may alias a when F32).
  virtual void mul(const Tensor& a, const Tensor& b, Tensor y) = 0;
  // y = act(gate, up) elementwise; gate, up F32 [T, n]; y act dtype.
  virtual void gated_activation(const Tensor& gate, const Tensor& up, const ActivationParams& act, Tensor y) = 0;
  // Attention Residuals' mix over depth (K3_SPEC.md §2): out[t] = sum_i softmax_i(score) V_i[t]
  // over V = [blocks[0..n_blocks), prefix]; blocks [n_blocks * T, hidden] (block i = rows
  // [i*T, (i+1)*T)); score_i = rmsnorm_noweight(V_i[t]) . (w_norm * w_proj). out may alias prefix.
  virtual void attn_res_mix(const Tensor& prefix, const Tensor& blocks, int n_blocks, const Tensor& w_norm,
                            const Tensor& w_proj, float eps, Tensor out) = 0;
  // y[i] = x[rows[i]]; rows in backend memory (e.g. BatchView::logit_rows).
  virtual void gather_rows(const Tensor& x, const int32_t* rows, Tensor y) = 0;
  // dst[i] = src[i] for every pair (same shape and dtype each): a verify step saving a KDA
  // layer's five recurrent inputs. The default is copy() each; CUDA copies them all in one
  // launch (five graph nodes a KDA layer become one).
  virtual void copy_many(std::span<const Tensor> src, std::span<const Tensor> dst) {
    for (size_t i = 0; i < src.size(); ++i) copy(src[i], dst[i]);
  }

  // ---- the vision tower (MoonViT-V2; model/vision/) ------------------------------------
  // Not every backend runs the tower: the defaults throw, so a backend (or a wrapper such
  // as a profiler) that lacks them fails by name instead of computing something else.
  //
  // y = GELU(x) elementwise: the tanh approximation (the tower's MLP, gelu_pytorch_tanh)
  // when tanh_approx, else the exact erf form (the projector's nn.GELU). x F32 [R, n];
  // y F32 or act dtype, same shape (may alias x when F32).
  virtual void gelu(const Tensor& x, bool tanh_approx, Tensor y) {
    throw BackendError("gelu: not implemented by this backend");
  }
  // Bidirectional multi-head attention within each image, with 2-D rotary embedding.
  // qkv [T, 3 * H * d] F32, each row [q | k | v], each part H heads of d (the tower's
  // packed wqkv output). rope [T, d] F32: for rotary pair i of every head, cos at 2i and
  // sin at 2i + 1; q and k pairs (2i, 2i+1) are rotated by it before the scores.
  // seq_starts (host, n_images + 1 entries, from 0 to T): image s owns rows
  // [seq_starts[s], seq_starts[s+1]) and attends to those alone. Scores scaled by d^-1/2,
  // softmax in fp32. out [T, H * d] F32.
  virtual void vision_attention(const Tensor& qkv, const Tensor& rope, std::span<const int32_t> seq_starts,
                                int num_heads, int head_dim, Tensor out) {
    throw BackendError("vision_attention: not implemented by this backend");
  }

  // ---- KDA (linear attention over state slots) ---------------------------------------
  // Causal depthwise conv over each sequence's rows, continuing from its slot's window
  // ([K-1, D] at window.slot(s), oldest row first), then SiLU when silu; the windows are
  // advanced. x, y [T, D] F32; weight [D, K] F32.
  virtual void short_conv(const Tensor& x, const Tensor& weight, const BatchView& batch, StateLayer window, bool silu,
                          Tensor y) = 0;
  // Each row x / sqrt(sum(x^2) + 1e-6) * scale (FLA's l2norm), in place.
  virtual void l2norm_rows(Tensor x, float scale) = 0;
  // The KDA decay gate in place: g [T, H*d] holds raw = f_b(f_a(x)) on entry; adds dt_bias
  // [1, H*d] and becomes lower_bound * sigmoid(exp(A_log[h]) raw) (K3), or
  // -exp(A_log[h]) softplus(raw) when lower_bound is NaN (Kimi Linear). A_log [1, H].
  virtual void kda_gate(Tensor g, const Tensor& A_log, const Tensor& dt_bias, int head_dim, float lower_bound) = 0;
  virtual void sigmoid(Tensor x) = 0;  // in place, F32
  // Rotary embedding in DeepSeek's interleaved order, in place: in each row t and head h, the
  // pairs (2i, 2i+1) of the rope part, cols [h*head_width + rope_offset, + rope_dim), turn by
  // the angle whose cosine is cos_sin[t, i] and sine cos_sin[t, rope_dim/2 + i]
  // (model/layers/rope.h builds the rows, plain or YaRN). x [T, n_heads*head_width] F32;
  // cos_sin [T, rope_dim] F32. Attention reads only dot products of rotated rows, so this
  // order and the reference's de-interleaved one give the same scores.
  virtual void rope_interleaved(Tensor x, const Tensor& cos_sin, int n_heads, int head_width, int rope_offset) = 0;
  // The delta-rule recurrence per head over each sequence's tokens, from and into its
  // state S [H, d, d] at state.slot(s):  S = Diag(exp(g)) S; S += beta k (v - S^T k)^T; o = S^T q.
  // q, k, v, g, o [T, H*d] F32 (q, k normalised, q scaled); beta [T, H] F32.
  virtual void kda_recurrence(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta,
                              const BatchView& batch, StateLayer state, int num_heads, int head_dim, KdaMode mode,
                              Tensor o) = 0;
  // FusedRMSNormGated(sigmoid) over head rows: y = w * o / sqrt(mean(o^2) + eps) * sigmoid(gate).
  // o, gate [T*H, d] F32; w [1, d]; y act dtype.
  virtual void gated_rmsnorm(const Tensor& o, const Tensor& gate, const Tensor& w, float eps, Tensor y) = 0;
  // Speculative decoding's rollback (model/layers/kda.h, kda_replay): the recurrence inputs of
  // a batch of replayed tokens, from the rows a verify step saved. Token t reads saved row
  // r.rows[t] of each saved block; q, k, v are the short conv (+ SiLU) of the saved
  // projections continuing each sequence's windows (which advance), then q, k l2-normed
  // (q times q_scale); g and beta are the saved rows as they are. Exactly the ops the default
  // runs (gather_rows, short_conv, l2norm_rows), so the state ends bit for bit where
  // kda_forward over those tokens would leave it; CUDA does it all in one launch.
  struct KdaReplayInputs {
    Tensor saved[5];  // q, k, v projections, g [capacity, H*d]; beta [capacity, H] (F32)
    Tensor rows;      // [T, 1] I32 in backend memory
    Tensor conv[3];   // the q, k, v conv weights [H*d, K]
    StateLayer window[3];
    int head_dim = 0;
    float q_scale = 1.0f;
    Tensor out[5];  // q, k, v, g [T, H*d]; beta [T, H] (F32)
  };
  virtual void kda_replay_inputs(const KdaReplayInputs& r, const BatchView& batch) {
    const int64_t T = r.out[0].rows;
    Tensor in = scratch(T, r.saved[0].cols, DType::F32);  // one conv's gathered input (caller's scope)
    for (int i = 0; i < 3; ++i) {
      gather_rows(r.saved[i], r.rows.as<int32_t>(), in);
      short_conv(in, r.conv[i], batch, r.window[i], /*silu=*/true, r.out[i]);
    }
    l2norm_rows(r.out[0].reshaped(r.head_dim), r.q_scale);
    l2norm_rows(r.out[1].reshaped(r.head_dim), 1.0f);
    gather_rows(r.saved[3], r.rows.as<int32_t>(), r.out[3]);
    gather_rows(r.saved[4], r.rows.as<int32_t>(), r.out[4]);
  }

  // ---- MLA (full attention over the paged latent cache) ------------------------------
  // Writes each new token's cache row [rmsnorm(latent) * w | k_pe] at its position.
  // ckv [T, kv_lora + rope] F32; norm_w [1, kv_lora].
  virtual void mla_store(const Tensor& ckv, const Tensor& norm_w, float eps, const BatchView& batch,
                         KvLayer cache) = 0;
  // Causal softmax attention of each new token over its sequence's positions [0, pos],
  // NoPE, scale (nope + rope)^-1/2; keys [k_nope_h | k_pe], values v_h from kv_b over the
  // cached latents (plain) or with kv_b folded into the query and output (absorbed).
  // q [T, H*(nope+rope)] F32, kv_b [H*(nope+v), kv_lora], o [T, H*v] F32.
  virtual void mla_attention(const Tensor& q, const Matrix& kv_b, const BatchView& batch, KvLayer cache,
                             const MlaShape& shape, MlaMode mode, Tensor o) = 0;

  // ---- DSA (DeepSeek Sparse Attention: MLA over each query's top-k keys; issue 38) ------
  // Not yet on every backend: the defaults throw, so a backend without them fails by name.
  // Indexer keys live in their own paged pool, one row of head_dim per token, on the latent
  // cache's page table (BatchSeq::page_start) and page size.
  //
  // Writes each new token's indexer key LayerNorm(k) * w + b (torch LayerNorm, eps given:
  // K3.1 uses rms_norm_eps) at its position. k [T, head_dim] F32 (the wk output); w, b [1, head_dim].
  // The pool is F32 rows of head_dim, or F8_E4M3 rows of head_dim codes + an fp32 scale
  // (backend/dsa_index_row.h), which dsa_index_scores reads dequantised.
  virtual void dsa_index_store(const Tensor& k, const Tensor& norm_w, const Tensor& norm_b, float eps,
                               const BatchView& batch, KvLayer cache) {
    throw BackendError("dsa_index_store: not implemented by this backend");
  }
  // Index scores I[t, s] = sum_h weights[t, h] * shape.weight_scale() * ReLU(q[t, h] . key[s])
  // over each new token's causal range s in [0, pos_t]; column s of row t is position s of
  // its sequence, and columns past pos_t hold -inf. q [T, H * head_dim] F32 (wq_b output),
  // weights [T, H] F32 (weights_proj output, unscaled), scores [T, C] F32 with C at least
  // the longest sequence's n_past + n_new. A block of the step's tokens: q, weights and
  // scores hold rows first_token .. first_token + rows - 1 of the batch (what bounds the
  // scores' memory at long contexts: model/layers/dsa.h).
  virtual void dsa_index_scores(const Tensor& q, const Tensor& weights, const BatchView& batch, KvLayer cache,
                                const DsaIndexerShape& shape, Tensor scores, int first_token = 0) {
    throw BackendError("dsa_index_scores: not implemented by this backend");
  }
  // Each query's top k = indices.cols positions by score among [0, pos_t], as increasing
  // positions followed by -1 when fewer than k are visible (then every visible one is kept).
  // Of equal scores the lower position is kept. scores as dsa_index_scores'; indices [T, k] I32
  // (or a block of rows from first_token, as there).
  virtual void dsa_topk(const Tensor& scores, const BatchView& batch, Tensor indices, int first_token = 0) {
    throw BackendError("dsa_topk: not implemented by this backend");
  }
  // mla_attention with each query reading only the positions in its row of indices [T, k]
  // I32 (dsa_topk's form: positions within its causal range, then -1s), as the reference
  // masks the others' scores to -inf. With every visible position listed it is mla_attention.
  virtual void mla_sparse_attention(const Tensor& q, const Matrix& kv_b, const BatchView& batch, KvLayer cache,
                                    const MlaShape& shape, MlaMode mode, const Tensor& indices, Tensor o) {
    throw BackendError("mla_sparse_attention: not implemented by this backend");
  }

  // ---- MoE ---------------------------------------------------------------------------
  // Top-k per token from router logits [T, E] F32 and bias [1, E] (may be empty):
  // ids [T, K] I32 in order of decreasing biased score, weights [T, K] F32.
  virtual void router_topk(const Tensor& logits, const Tensor& bias, const RouterParams& p, Tensor ids,
                           Tensor weights) = 0;
  // Stacked experts just uploaded (each once, before any moe_experts over them): rewrite
  // them into this backend's own layout. The CPU keeps the checkpoint's; CUDA re-lays each
  // word of MXFP4 codes pair-ready for the bf16 tensor cores (cuda/moe/mxfp4_pairs.h), and
  // with MOONRUN_INT4_FAST=1 INT4 words for the same kernels (cuda/moe/int4_pairs.h, setting
  // Matrix::backend_layout).
  virtual void repack_experts(ExpertMatrices& m) { (void)m; }
  // y[t] = sum_k weights[t, k] * w2_e(act(w1_e x[t], w3_e x[t])), e = ids[t, k], k ascending.
  // x [T, in] act dtype; y [T, in] F32. Each expert runs once over the tokens that chose it.
  virtual void moe_experts(const Tensor& x, const Tensor& ids, const Tensor& weights, const ExpertMatrices& w1,
                           const ExpertMatrices& w3, const ExpertMatrices& w2, const ActivationParams& act,
                           Tensor y) = 0;

  // ---- DSpark draft heads (model/dspark_draft) ----------------------------------------
  // The Markov head, slot by slot over each block (a slot's bias depends on the token drafted
  // before it). For block b of logits [n_blocks * block, V] F32: prev = ids[b * block] (the
  // anchor; ids is backend memory), then for k < n_slots: e = w1[prev], row b*block + k +=
  // w2 · e (w1, w2 [V, rank] F32), tokens[b * block + k] = argmax of that row (the lowest id
  // on ties), prev = that token. With conf_w [1, H (+ rank)] not empty, the confidence head:
  // conf[b * block + k] = sigmoid(conf_b + conf_w[:H] · h[row] (+ conf_w[H:] · e)), h [rows,
  // H] F32. tokens [n_blocks * block, 1] I32 and conf [n_blocks * block, 1] F32 (backend
  // memory); their rows past n_slots and those logits rows are left as they were.
  virtual void dspark_markov(Tensor logits, const Tensor& w1, const Tensor& w2, const int32_t* ids, int block,
                             int n_slots, const Tensor& h, const Tensor& conf_w, float conf_b, Tensor tokens,
                             Tensor conf) = 0;

  // ---- logits -> tokens --------------------------------------------------------------
  // One token per row of logits [R, vocab] F32 under rows[r] (backend/sampling.h), with the
  // raw log-probabilities when a row asks. Results are host values.
  virtual void sample(const Tensor& logits, const SamplingBatch& rows, std::vector<SampleResult>& out) = 0;

  // ---- collectives (tensor / expert parallel; backend/comm.h) ------------------------
  // Over this rank's group; at one rank, x stays and out = x.
  // x [rows, cols] F32 = the sum over the ranks of their x.
  virtual void all_reduce_sum(Tensor x) = 0;
  // out [rows, W * cols] F32: rank r's x [rows, cols] F32 in columns [r * cols, (r + 1) * cols)
  // (the vocab-parallel lm_head's logits).
  virtual void all_gather_cols(const Tensor& x, Tensor out) = 0;
  // Several blocks gathered as all_gather_cols gathers one, in one collective: parts[i]
  // [rows_i, c_i] F32 lie one after another in one buffer (parts[i + 1].data where parts[i]
  // ends), outs[i] [rows_i, W * c_i] (the split router's logits and the split LatentMoE down
  // projection's rows: one all-gather a MoE layer instead of two). This default issues one
  // collective a part.
  virtual void all_gather_cols_packed(std::span<const Tensor> parts, std::span<Tensor> outs) {
    for (size_t i = 0; i < parts.size(); ++i) all_gather_cols(parts[i], outs[i]);
  }
  // A hint from the forward (issue 41: overlap the collectives with the next weights'
  // reads): the weights it reads after this rank's next collective, first-read first. A
  // GPU backend may pull their leading bytes into L2 on a side stream while that collective
  // waits on the other ranks (CUDA: MOONRUN_L2_PREFETCH_MB, off by default); it changes no
  // value. The next collective consumes the hint; one that comes before any replaces it.
  virtual void prefetch_during_next_collective(std::span<const Tensor> weights) {}
  virtual int parallel_rank() const { return 0; }
  virtual int parallel_size() const { return 1; }
  // After this rank failed: every rank waiting in (or entering) a collective of the group
  // gets a BackendError instead of waiting for this one forever.
  virtual void abort_collectives(const std::string& why) {}

  // ---- pipeline parallelism (--pp-size) -----------------------------------------------
  // This rank's links to the same tensor-parallel rank of the previous and the next stage
  // (round the ring: the last stage's next is stage 0): two-rank groups, the sender the
  // root of each transfer, whichever rank it has.
  // abort_collectives aborts them too. A backend that cannot run stages throws.
  virtual void set_pipeline(std::unique_ptr<Communicator> prev, std::unique_ptr<Communicator> next) {
    if (prev || next) throw BackendError(std::string(name()) + ": pipeline stages are not supported");
  }
  // x [rows, cols] F32 to the next stage, which receives it into a tensor of its shape.
  virtual void pipe_send(const Tensor& x) { throw BackendError("pipe_send: this rank has no next stage"); }
  virtual void pipe_recv(Tensor x) { throw BackendError("pipe_recv: this rank has no previous stage"); }

  // ---- execution ---------------------------------------------------------------------
  // Makes this backend's device current on the calling thread (a CUDA rank's GPU); called
  // by each thread that issues ops (the parallel runner's rank threads, the loader).
  virtual void bind_thread() {}
  virtual void synchronize() = 0;
  // Runs body; a backend that can capture (CUDA graphs) records it the first time a key is
  // seen and replays the recording afterwards. The body must then issue the same ops on the
  // same scratch addresses every time, reading its per-step inputs from backend memory.
  virtual void run_captured(uint64_t key, const std::function<void()>& body) { body(); }
  virtual bool captures() const { return false; }
  // A second lane of this backend (issue #47, runtime/prefill_lane.h): another Ops over the
  // same device that reads and writes this one's long-lived memory (weights, cache pools)
  // from its own thread, with its own scratch of `scratch_bytes` and, on a GPU, its own
  // stream at the lowest priority (this one's runs at the highest), so that a long prefill
  // chunk issued there leaves the decode steps issued here the multiprocessors they need as
  // soon as its blocks retire. It allocates no long-lived memory. The scratch is taken from
  // this backend's long-lived memory (before the cache pools are sized). A rank of a
  // tensor-parallel group passes `comm`, its member of a second group that the lanes of the
  // group's ranks share, so a lane's collectives never interleave with this backend's on one
  // communicator (nullptr at one rank). nullptr: this backend has no lane here (a pipeline
  // stage, or a group's rank without a comm for its lane).
  virtual std::unique_ptr<Ops> make_lane(size_t scratch_bytes, std::unique_ptr<Communicator> comm) {
    return nullptr;
  }
};

// Releases a layer's temporaries when it goes out of scope.
class ScratchScope {
 public:
  explicit ScratchScope(Ops& ops) : ops_(ops), mark_(ops.scratch_mark()) {}
  ~ScratchScope() { ops_.scratch_rewind(mark_); }
  ScratchScope(const ScratchScope&) = delete;
  ScratchScope& operator=(const ScratchScope&) = delete;

 private:
  Ops& ops_;
  size_t mark_;
};

}  // namespace moonrun
