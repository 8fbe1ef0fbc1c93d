#pragma once
// The CPU backend: every op of backend/ops.h in float32 on the host, through the reference
// kernels beside this file. Weights are F32 (the loader converts bf16 on the way in), MXFP4
// experts stay packed and are dequantised per call, the KV cache is F32. The ops that work
// per sequence (conv windows, recurrences, attention) loop over the batch's sequences.
#include <cstddef>
#include <memory>
#include <vector>

#include "backend/comm.h"
#include "backend/ops.h"

namespace moonrun::cpu {

class CpuOps final : public Ops {
 public:
  // comm: the rank's communicator when it is one rank of a tensor/expert-parallel group
  // (nullptr: a group of one).
  explicit CpuOps(std::unique_ptr<Communicator> comm = nullptr);
  ~CpuOps() override;

  const char* name() const override { return "cpu"; }
  DType act_dtype() const override { return DType::F32; }
  DType weight_dtype() const override { return DType::F32; }

  Tensor alloc(int64_t rows, int64_t cols, DType dtype, const char* what) override;
  size_t allocated_bytes() const override { return allocated_bytes_; }
  void upload(const Tensor& t, size_t offset_bytes, const void* host, size_t bytes) override;
  void download(const Tensor& t, void* host) override;
  void zero(const Tensor& t) override;
  void copy(const Tensor& src, const Tensor& dst) override;
  void copy_cols(const Tensor& src, int64_t src_col, const Tensor& dst, int64_t dst_col, int64_t n_cols) override;
  Tensor scratch(int64_t rows, int64_t cols, DType dtype) override;
  size_t scratch_mark() const override { return scratch_used_; }
  void scratch_rewind(size_t mark) override;
  void reset_scratch() override;

  BatchView upload_batch(const ForwardBatch& batch, int area = 0) override;

  void embedding(const Tensor& table, int64_t first_row, const BatchView& batch, Tensor out) override;
  void rmsnorm(const Tensor& x, const Tensor& w, float eps, Tensor y) override;
  void linear(const Tensor& x, const Matrix& w, Tensor y) override;
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
  void l2norm_rows(Tensor x, float scale) override;
  void kda_gate(Tensor g, const Tensor& A_log, const Tensor& dt_bias, int head_dim, float lower_bound) override;
  void sigmoid(Tensor x) override;
  void rope_interleaved(Tensor x, const Tensor& cos_sin, int n_heads, int head_width, int rope_offset) override;
  void kda_recurrence(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta,
                      const BatchView& batch, StateLayer state, int num_heads, int head_dim, KdaMode mode,
                      Tensor o) override;
  void gated_rmsnorm(const Tensor& o, const Tensor& gate, const Tensor& w, float eps, Tensor y) override;

  void mla_store(const Tensor& ckv, const Tensor& norm_w, float eps, const BatchView& batch, KvLayer cache) override;
  void mla_attention(const Tensor& q, const Matrix& kv_b, const BatchView& batch, KvLayer cache,
                     const MlaShape& shape, MlaMode mode, Tensor o) override;

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
  int parallel_rank() const override { return comm_ ? comm_->rank() : 0; }
  int parallel_size() const override { return comm_ ? comm_->size() : 1; }
  void set_pipeline(std::unique_ptr<Communicator> prev, std::unique_ptr<Communicator> next) override {
    pipe_prev_ = std::move(prev);
    pipe_next_ = std::move(next);
  }
  void pipe_send(const Tensor& x) override;
  void pipe_recv(Tensor x) override;
  void abort_collectives(const std::string& why) override {
    if (comm_) comm_->abort(why);
    if (pipe_prev_) pipe_prev_->abort(why);
    if (pipe_next_) pipe_next_->abort(why);
  }

  void synchronize() override {}
  // Another CpuOps: the host's memory is every lane's, its scratch grows on demand.
  std::unique_ptr<Ops> make_lane(size_t, std::unique_ptr<Communicator> comm) override {
    if (pipe_prev_ || pipe_next_ || (comm_ && comm_->size() > 1 && !comm)) return nullptr;
    return std::make_unique<CpuOps>(std::move(comm));
  }

 private:
  struct Block {
    std::unique_ptr<char[]> bytes;
    size_t size = 0;
    size_t begin = 0;  // offset of this block in the scratch's running total
  };
  std::unique_ptr<Communicator> comm_;
  std::unique_ptr<Communicator> pipe_prev_, pipe_next_;  // set_pipeline
  std::vector<float> gather_buf_;
  std::vector<std::unique_ptr<char[]>> persistent_;
  size_t allocated_bytes_ = 0;
  std::vector<Block> scratch_blocks_;
  size_t scratch_used_ = 0;  // running total over the blocks (the mark)
  size_t scratch_high_water_ = 0;
};

}  // namespace moonrun::cpu
