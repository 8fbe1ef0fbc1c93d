#pragma once
// Where a step's time goes, op by op: ProfiledOps wraps a backend and, around every op the
// model issues, waits for the device, times the op alone and adds its time and the bytes it
// must move (weights read, caches and states read and written, activations in and out) to
// an OpProfile. The waits make a profiled step slower than a real one (a launch and a sync
// per op, no CUDA graph): the table says so by setting the ops' sum beside the real step.
// Backend-independent, so the CPU and CUDA backends are profiled by the same code
// (`moonrun bench-model --profile`).
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "backend/ops.h"

namespace moonrun {

struct OpStat {
  std::string op;        // "linear [12288 x 7168] bf16", "moe_experts", ...
  int64_t calls = 0;
  double seconds = 0;
  double bytes = 0;      // what the op must move at least (its memory floor)
  double flops = 0;      // 2 x multiply-adds of its GEMM-like work (0: not counted)
};

class OpProfile {
 public:
  void add(const std::string& op, double seconds, double bytes, double flops);
  void clear() { stats_.clear(); }
  // Largest time first.
  std::vector<OpStat> sorted() const;
  double total_seconds() const;

 private:
  std::map<std::string, OpStat> stats_;
};

class ProfiledOps final : public Ops {
 public:
  ProfiledOps(Ops& inner, OpProfile& profile) : in_(inner), profile_(profile) {}

  const char* name() const override { return in_.name(); }
  DType act_dtype() const override { return in_.act_dtype(); }
  DType weight_dtype() const override { return in_.weight_dtype(); }
  Tensor alloc(int64_t rows, int64_t cols, DType dtype, const char* what) override {
    return in_.alloc(rows, cols, dtype, what);
  }
  size_t allocated_bytes() const override { return in_.allocated_bytes(); }
  int64_t free_bytes() const override { return in_.free_bytes(); }
  void upload(const Tensor& t, size_t offset_bytes, const void* host, size_t bytes) override {
    in_.upload(t, offset_bytes, host, bytes);
  }
  void download(const Tensor& t, void* host) override { in_.download(t, host); }
  void zero(const Tensor& t) override;
  void copy(const Tensor& src, const Tensor& dst) override;
  void copy_many(std::span<const Tensor> src, std::span<const Tensor> dst) override;
  void copy_cols(const Tensor& src, int64_t src_col, const Tensor& dst, int64_t dst_col, int64_t n_cols) override {
    in_.copy_cols(src, src_col, dst, dst_col, n_cols);
  }
  Tensor scratch(int64_t rows, int64_t cols, DType dtype) override { return in_.scratch(rows, cols, dtype); }
  size_t scratch_mark() const override { return in_.scratch_mark(); }
  void scratch_rewind(size_t mark) override { in_.scratch_rewind(mark); }
  void reset_scratch() override { in_.reset_scratch(); }
  BatchView upload_batch(const ForwardBatch& batch, int area = 0) override { return in_.upload_batch(batch, area); }

  void repack_experts(ExpertMatrices& m) override { in_.repack_experts(m); }
  void embedding(const Tensor& table, int64_t first_row, const BatchView& batch, Tensor out) override;
  void rmsnorm(const Tensor& x, const Tensor& w, float eps, Tensor y) override;
  void linear(const Tensor& x, const Matrix& w, Tensor y) override;
  void linear_shared_input(const Tensor& x, std::span<const Matrix* const> ws, std::span<const Tensor> ys) override;
  void add(const Tensor& a, const Tensor& b, Tensor y) override;
  void mul(const Tensor& a, const Tensor& b, Tensor y) override;
  void gated_activation(const Tensor& gate, const Tensor& up, const ActivationParams& act, Tensor y) override;
  void attn_res_mix(const Tensor& prefix, const Tensor& blocks, int n_blocks, const Tensor& w_norm,
                    const Tensor& w_proj, float eps, Tensor out) override;
  void gather_rows(const Tensor& x, const int32_t* rows, Tensor y) override;
  void gelu(const Tensor& x, bool tanh_approx, Tensor y) override;
  void vision_attention(const Tensor& qkv, const Tensor& rope, std::span<const int32_t> seq_starts, int num_heads,
                        int head_dim, Tensor out) override;
  void short_conv(const Tensor& x, const Tensor& weight, const BatchView& batch, StateLayer window, bool silu,
                  Tensor y) override;
  void kda_replay_inputs(const KdaReplayInputs& r, const BatchView& batch) override;
  void l2norm_rows(Tensor x, float scale) override;
  void kda_gate(Tensor g, const Tensor& A_log, const Tensor& dt_bias, int head_dim, float lower_bound) override;
  void sigmoid(Tensor x) override;
  void rope_interleaved(Tensor x, const Tensor& cos_sin, int n_heads, int head_width, int rope_offset) override;
  void kda_recurrence(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta,
                      const BatchView& batch, StateLayer state, int num_heads, int head_dim, KdaMode mode,
                      Tensor o) override;
  void gated_rmsnorm(const Tensor& o, const Tensor& gate, const Tensor& w, float eps, Tensor y) override;
  void mla_store(const Tensor& ckv, const Tensor& norm_w, float eps, const BatchView& batch, KvLayer cache) override;
  void mla_attention(const Tensor& q, const Matrix& kv_b, const BatchView& batch, KvLayer cache, const MlaShape& shape,
                     MlaMode mode, Tensor o) override;
  void dsa_index_store(const Tensor& k, const Tensor& norm_w, const Tensor& norm_b, float eps, const BatchView& batch,
                       KvLayer cache) override;
  void dsa_index_scores(const Tensor& q, const Tensor& weights, const BatchView& batch, KvLayer cache,
                        const DsaIndexerShape& shape, Tensor scores, int first_token = 0) override;
  void dsa_topk(const Tensor& scores, const BatchView& batch, Tensor indices, int first_token = 0) override;
  void mla_sparse_attention(const Tensor& q, const Matrix& kv_b, const BatchView& batch, KvLayer cache,
                            const MlaShape& shape, MlaMode mode, const Tensor& indices, Tensor o) override;
  void router_topk(const Tensor& logits, const Tensor& bias, const RouterParams& p, Tensor ids,
                   Tensor weights) override;
  void moe_experts(const Tensor& x, const Tensor& ids, const Tensor& weights, const ExpertMatrices& w1,
                   const ExpertMatrices& w3, const ExpertMatrices& w2, const ActivationParams& act,
                   Tensor y) override;
  void dspark_markov(Tensor logits, const Tensor& w1, const Tensor& w2, const int32_t* ids, int block, int n_slots,
                     const Tensor& h, const Tensor& conf_w, float conf_b, Tensor tokens, Tensor conf) override;
  void sample(const Tensor& logits, const SamplingBatch& rows, std::vector<SampleResult>& out) override;
  void all_reduce_sum(Tensor x) override;
  void all_gather_cols(const Tensor& x, Tensor out) override;
  void all_gather_cols_packed(std::span<const Tensor> parts, std::span<Tensor> outs) override;
  int parallel_rank() const override { return in_.parallel_rank(); }
  int parallel_size() const override { return in_.parallel_size(); }
  void abort_collectives(const std::string& why) override { in_.abort_collectives(why); }
  void pipe_send(const Tensor& x) override { in_.pipe_send(x); }
  void pipe_recv(Tensor x) override { in_.pipe_recv(x); }
  void bind_thread() override { in_.bind_thread(); }
  void synchronize() override { in_.synchronize(); }
  // Profiled steps run eagerly: a captured graph would hide the ops from the timer.
  void run_captured(uint64_t, const std::function<void()>& body) override { body(); }
  bool captures() const override { return false; }

 private:
  // Waits for the device, runs fn, waits again, and books the time under op.
  template <class Fn>
  void timed(const std::string& op, double bytes, double flops, Fn&& fn);

  Ops& in_;
  OpProfile& profile_;
};

}  // namespace moonrun
