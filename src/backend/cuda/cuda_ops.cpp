// CudaOps: backend/ops.h on one GPU, over the kernels of the folders beside this file. Each
// op checks its shapes and dtypes, then launches on the backend's one stream. Per-sequence
// work reads the batch's device tables (BatchView), so a decode step issues the same
// launches with the same arguments every time and can be captured as a CUDA graph;
// prefill sequences (several new tokens) take per-sequence paths that are only run eagerly.
#include "backend/cuda/cuda_ops.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>

#include "backend/cpu/sample.h"
#include "backend/cuda/common/bf16.h"
#include "backend/cuda/common/cuda_check.h"
#include "backend/cuda/common/l2_prefetch.h"
#include "backend/cuda/common/device_buffer.h"
#include "backend/cuda/common/device_info.h"
#include "backend/cuda/dense/dense_ops.h"
#include "backend/cuda/gemm/blas.h"
#include "backend/cuda/kda/kda_ops.h"
#include "backend/cuda/mla/dsa_ops.h"
#include "backend/cuda/mla/mla_ops.h"
#include "backend/cuda/moe/moe_ops.h"
#include "backend/cuda/sample/sample_ops.h"
#include "backend/cuda/vision/vision_ops.h"
#include "backend/dsa_index_row.h"

namespace moonrun::cuda {

namespace {

// Device memory the arena leaves to the CUDA context, cuBLAS workspaces and graphs.
constexpr size_t kHeadroomBytes = size_t{1} << 30;

void check(bool ok, const std::string& what) {
  if (!ok) throw CudaError(what);
}
std::string shape(const Tensor& t) {
  return std::string(dtype_name(t.dtype)) + " [" + std::to_string(t.rows) + ", " + std::to_string(t.cols) + "]";
}
void same_shape(const Tensor& a, const Tensor& b, const char* op) {
  check(a.rows == b.rows && a.cols == b.cols, std::string(op) + ": " + shape(a) + " vs " + shape(b));
}
void is_f32(const Tensor& t, const char* op) { check(t.dtype == DType::F32, std::string(op) + ": needs F32, got " + shape(t)); }

StackedExperts stacked(const ExpertMatrices& m) {
  StackedExperts s;
  s.w = m.stacked.w.data;
  s.out = m.stacked.out;
  s.in = m.stacked.in;
  if (m.stacked.mxfp4()) {
    s.kind = StackedExperts::Kind::mxfp4;
    s.scales = m.stacked.scales.as<uint8_t>();
  } else if (m.stacked.int4()) {
    check(m.stacked.w.dtype == DType::I32 && m.stacked.scales.dtype == DType::BF16,
          "INT4 experts: need I32 words and BF16 scales");
    // Re-laid by repack_experts for the fast kernels (MOONRUN_INT4_FAST=1), or as stored.
    s.kind = m.stacked.backend_layout ? StackedExperts::Kind::int4_pairs : StackedExperts::Kind::int4;
    s.scales = m.stacked.scales.as<uint8_t>();  // the bf16 scales' bytes (moe_ops.h)
  } else {
    s.kind = m.stacked.w.dtype == DType::BF16 ? StackedExperts::Kind::bf16 : StackedExperts::Kind::f32;
  }
  return s;
}

// INT4 experts re-laid at load and run on the MXFP4 kernels' fast paths (decode stream,
// tensor-core prefill; moe_ops.h), exact in the weights (q * scale in fp32). On by default
// since they were measured on a K2.7-width slice (H100, 2026-12-07: decode 1.07x / 1.55x /
// 2.5x / 4.0x at b = 1 / 8 / 32 / 128, prefill 6.2x; docs/performance.md);
// MOONRUN_INT4_FAST=0 keeps the reference grouped kernel, which reads the words as stored.
// Read when a matrix is repacked, so each matrix keeps the layout it was loaded with
// (Matrix::backend_layout).
bool int4_fast() {
  const char* v = std::getenv("MOONRUN_INT4_FAST");
  return v == nullptr || std::strcmp(v, "0") != 0;
}

// Speculative decoding's rollback in few launches: a verify step's five saves of a KDA layer
// in one copy_many launch, and the replay's gathers, convs and norms in one
// kda_replay_inputs launch (13 -> 1 a layer). On by default since measured (H100,
// 2026-12-07: a demo-model verify step 1.35 -> 1.20 decode steps); MOONRUN_FUSED_ROLLBACK=0
// runs the unfused ops (bit for bit the same results).
bool fused_rollback() {
  const char* v = std::getenv("MOONRUN_FUSED_ROLLBACK");
  return v == nullptr || std::strcmp(v, "0") != 0;
}

// The DSA indexer-key pool: F32 rows of D, or FP8 rows of D codes + a 4-byte-aligned scale.
bool index_pool_ok(const KvLayer& c, int D) {
  return (c.dtype == DType::F32 && c.row_width == D) ||
         (c.dtype == DType::F8_E4M3 && c.row_width == dsa_fp8_row_width(D) && D % 4 == 0);
}

BatchTables tables(const BatchView& b) { return BatchTables{b.positions, b.token_seq, b.seqs, b.page_table}; }

}  // namespace

class CudaOps final : public Ops {
  // upload_batch's staging: per area one pinned host blob and its device copy.
  struct Staging {
    int32_t* host = nullptr;  // pinned
    int32_t* device = nullptr;
    size_t words = 0;
  };

 public:
  CudaOps(const CudaOpsOptions& o, size_t arena_bytes, std::unique_ptr<Communicator> comm)
      : CudaOps(o, std::make_unique<DeviceArena>(arena_bytes), std::move(comm), /*lane=*/false) {}
  // lane: a second lane's ops (make_lane): arena is a view of its scratch, its stream the
  // device's lowest priority; otherwise the stream gets the highest, which changes nothing
  // while it is the only one.
  CudaOps(const CudaOpsOptions& o, std::unique_ptr<DeviceArena> arena, std::unique_ptr<Communicator> comm, bool lane)
      : options_(o), device_(o.device), float32_(o.float32), lane_(lane), arena_(std::move(arena)),
        comm_(std::move(comm)) {
    int least = 0, greatest = 0;
    CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    CUDA_CHECK(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, lane ? least : greatest));
    wgmma_ = wgmma_available(device_);
    blas_ = std::make_unique<Blas>(stream_);
    if (comm_) comm_->bind_stream(stream_);
  }
  ~CudaOps() override {
    cudaSetDevice(device_);
    cudaStreamSynchronize(stream_);
    comm_.reset();
    pipe_prev_.reset();
    pipe_next_.reset();
    for (auto& [key, exec] : graphs_) cudaGraphExecDestroy(exec);
    if (prefetch_stream_) {
      cudaStreamSynchronize(prefetch_stream_);
      cudaStreamDestroy(prefetch_stream_);
      cudaEventDestroy(prefetch_fork_);
      cudaEventDestroy(prefetch_join_);
    }
    blas_.reset();
    for (Staging& st : staging_) {
      if (st.host) cudaFreeHost(st.host);
      if (st.device) cudaFree(st.device);
    }
    if (sample_staging_) cudaFreeHost(sample_staging_);
    cudaStreamDestroy(stream_);
  }

  const char* name() const override { return "cuda"; }
  DType act_dtype() const override { return float32_ ? DType::F32 : DType::BF16; }
  DType weight_dtype() const override { return act_dtype(); }

  // ---- memory ------------------------------------------------------------------------
  Tensor alloc(int64_t rows, int64_t cols, DType dtype, const char* what) override {
    Tensor t{nullptr, dtype, rows, cols};
    if (lane_) throw BackendError(std::string("a backend lane allocates no long-lived memory (") + what + ")");
    t.data = arena_->alloc_bytes(t.nbytes(), what);
    if (t.nbytes()) CUDA_CHECK(cudaMemsetAsync(t.data, 0, t.nbytes(), stream_));
    return t;
  }
  size_t allocated_bytes() const override { return arena_->used(); }
  int64_t free_bytes() const override { return static_cast<int64_t>(arena_->available()); }
  void upload(const Tensor& t, size_t offset_bytes, const void* host, size_t bytes) override {
    check(offset_bytes + bytes <= t.nbytes(), "upload past the tensor's end");
    if (!bytes) return;
    CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(t.data) + offset_bytes, host, bytes, cudaMemcpyHostToDevice, stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));  // the host buffer may be reused on return
  }
  void download(const Tensor& t, void* host) override {
    if (!t.nbytes()) return;
    CUDA_CHECK(cudaMemcpyAsync(host, t.data, t.nbytes(), cudaMemcpyDeviceToHost, stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  void zero(const Tensor& t) override {
    if (t.nbytes()) CUDA_CHECK(cudaMemsetAsync(t.data, 0, t.nbytes(), stream_));
  }
  void copy(const Tensor& src, const Tensor& dst) override {
    same_shape(src, dst, "copy");
    if (src.dtype == dst.dtype) {
      if (src.data != dst.data)
        CUDA_CHECK(cudaMemcpyAsync(dst.data, src.data, src.nbytes(), cudaMemcpyDeviceToDevice, stream_));
    } else if (src.dtype == DType::F32 && dst.dtype == DType::BF16) {
      to_bf16(src.as<float>(), src.numel(), dst.as<bf16>(), stream_);
    } else if (src.dtype == DType::BF16 && dst.dtype == DType::F32) {
      to_f32(src.as<bf16>(), src.numel(), dst.as<float>(), stream_);
    } else {
      throw CudaError("copy from " + shape(src) + " to " + shape(dst));
    }
  }
  void copy_many(std::span<const Tensor> src, std::span<const Tensor> dst) override {
    check(src.size() == dst.size(), "copy_many: as many sources as destinations");
    if (!fused_rollback()) return Ops::copy_many(src, dst);
    cuda::CopyManyArgs args;
    for (size_t i = 0; i < src.size(); ++i) {
      same_shape(src[i], dst[i], "copy_many");
      if (src[i].dtype != dst[i].dtype || args.n == cuda::kCopyManyMax) {  // a conversion, or too many: one by one
        copy(src[i], dst[i]);
        continue;
      }
      args.src[args.n] = src[i].data;
      args.dst[args.n] = dst[i].data;
      args.bytes[args.n++] = src[i].nbytes();
    }
    cuda::copy_many(args, stream_);
  }
  void copy_cols(const Tensor& src, int64_t src_col, const Tensor& dst, int64_t dst_col, int64_t n_cols) override {
    check(src.dtype == dst.dtype && src.rows == dst.rows && src_col >= 0 && dst_col >= 0 && n_cols >= 0 &&
              src_col + n_cols <= src.cols && dst_col + n_cols <= dst.cols,
          "copy_cols: " + shape(src) + " -> " + shape(dst));
    if (n_cols == 0 || src.rows == 0) return;
    const size_t es = dtype_size_bytes(src.dtype);
    CUDA_CHECK(cudaMemcpy2DAsync(static_cast<char*>(dst.data) + dst_col * es, dst.cols * es,
                                 static_cast<const char*>(src.data) + src_col * es, src.cols * es, n_cols * es, src.rows,
                                 cudaMemcpyDeviceToDevice, stream_));
  }
  Tensor scratch(int64_t rows, int64_t cols, DType dtype) override {
    Tensor t{nullptr, dtype, rows, cols};
    t.data = arena_->take_scratch(t.nbytes());
    return t;
  }
  size_t scratch_mark() const override { return arena_->scratch_mark(); }
  void scratch_rewind(size_t mark) override { arena_->rewind_scratch(mark); }
  void reset_scratch() override { arena_->rewind_scratch(0); }

  // ---- the batch ---------------------------------------------------------------------
  // One packed int32 blob, one copy: the fixed-size tables first and the page table last,
  // so that for a given decode batch size every table but the page table keeps its address
  // (what a captured graph read).
  BatchView upload_batch(const ForwardBatch& b, int area = 0) override {
    check(area >= 0 && area < kBatchAreas, "upload_batch: staging area " + std::to_string(area));
    Staging& st = staging_[area];
    const size_t n = b.token_ids.size(), ns = b.seqs.size(), nl = b.logit_rows.size();
    const size_t seq_words = sizeof(BatchSeq) / sizeof(int32_t);
    const size_t words = 3 * n + nl + ns * seq_words + b.page_table.size();
    if (words > st.words) grow_blob(st, words);
    int32_t* h = st.host;
    size_t at = 0;
    auto put = [&](const void* src, size_t count) {
      std::memcpy(h + at, src, count * sizeof(int32_t));
      const int32_t* dev = st.device + at;
      at += count;
      return dev;
    };
    BatchView v;
    v.host = &b;
    v.token_ids = put(b.token_ids.data(), n);
    v.positions = put(b.positions.data(), n);
    v.token_seq = put(b.token_seq.data(), n);
    v.logit_rows = put(b.logit_rows.data(), nl);
    v.seqs = reinterpret_cast<const BatchSeq*>(put(b.seqs.data(), ns * seq_words));
    v.page_table = put(b.page_table.data(), b.page_table.size());
    CUDA_CHECK(cudaMemcpyAsync(st.device, st.host, at * sizeof(int32_t), cudaMemcpyHostToDevice, stream_));
    return v;
  }

  // ---- dense -------------------------------------------------------------------------
  void embedding(const Tensor& table, int64_t first_row, const BatchView& batch, Tensor out) override {
    is_f32(out, "embedding");
    check(out.rows == batch.n_tokens() && out.cols == table.cols, "embedding: output " + shape(out));
    const int hidden = static_cast<int>(table.cols);
    if (table.dtype == DType::BF16)
      embed_tokens(table.as<bf16>(), first_row, table.rows, hidden, batch.token_ids, batch.n_tokens(),
                   out.as<float>(), stream_);
    else
      embed_tokens(table.as<float>(), first_row, table.rows, hidden, batch.token_ids, batch.n_tokens(),
                   out.as<float>(), stream_);
  }
  void rmsnorm(const Tensor& x, const Tensor& w, float eps, Tensor y) override {
    is_f32(x, "rmsnorm");
    same_shape(x, y, "rmsnorm");
    const int rows = static_cast<int>(x.rows), dim = static_cast<int>(x.cols);
    if (y.dtype == DType::BF16) cuda::rmsnorm(x.as<float>(), rows, dim, w.as<float>(), eps, y.as<bf16>(), stream_);
    else cuda::rmsnorm(x.as<float>(), rows, dim, w.as<float>(), eps, y.as<float>(), stream_);
  }
  void linear(const Tensor& x, const Matrix& w, Tensor y) override {
    check(w.kind() == WeightFormat::dense, "linear over a quantized (MXFP4 / INT4) matrix");
    check(x.cols == w.in && y.cols == w.out && x.rows == y.rows,
          "linear: x " + shape(x) + " W [" + std::to_string(w.out) + ", " + std::to_string(w.in) + "] y " + shape(y));
    const int n = static_cast<int>(x.rows);
    if (x.dtype == DType::BF16 && w.w.dtype == DType::BF16) {
      const DeviceLinear lin{w.w.as<bf16>(), w.out, w.in};
      if (y.dtype == DType::BF16) blas_->linear(x.as<bf16>(), n, lin, y.as<bf16>());
      else blas_->linear(x.as<bf16>(), n, lin, y.as<float>());
    } else if (x.dtype == DType::F32 && w.w.dtype == DType::F32 && y.dtype == DType::F32) {
      blas_->linear_f32(x.as<float>(), n, w.w.as<float>(), w.out, w.in, y.as<float>());
    } else {
      throw CudaError("linear: x " + shape(x) + " with a " + dtype_name(w.w.dtype) + " weight into " + shape(y));
    }
  }
  void linear_shared_input(const Tensor& x, std::span<const Matrix* const> ws, std::span<const Tensor> ys) override {
    check(ws.size() == ys.size(), "linear_shared_input: as many outputs as matrices");
    if (ws.size() < 2 || x.dtype != DType::BF16) return Ops::linear_shared_input(x, ws, ys);
    const Matrix& w0 = *ws[0];
    const Tensor& y0 = ys[0];
    const size_t w_bytes = static_cast<size_t>(w0.out) * w0.in * sizeof(bf16);
    bool back_to_back = !w0.mxfp4() && w0.w.dtype == DType::BF16 && y0.rows == x.rows && y0.cols == w0.out &&
                        x.cols == w0.in && (y0.dtype == DType::F32 || y0.dtype == DType::BF16);
    for (size_t i = 1; back_to_back && i < ws.size(); ++i) {
      const Matrix& w = *ws[i];
      back_to_back = !w.mxfp4() && w.w.dtype == DType::BF16 && w.out == w0.out && w.in == w0.in &&
                     w.w.data == static_cast<const char*>(w0.w.data) + i * w_bytes && ys[i].dtype == y0.dtype &&
                     ys[i].rows == y0.rows && ys[i].cols == y0.cols &&
                     ys[i].data == static_cast<const char*>(y0.data) + i * y0.nbytes();
    }
    if (!back_to_back) return Ops::linear_shared_input(x, ws, ys);
    const DeviceLinear lin{w0.w.as<bf16>(), w0.out, w0.in};
    const int n = static_cast<int>(x.rows), batch = static_cast<int>(ws.size());
    if (y0.dtype == DType::BF16) blas_->linear_batched(x.as<bf16>(), n, lin, batch, y0.as<bf16>());
    else blas_->linear_batched(x.as<bf16>(), n, lin, batch, y0.as<float>());
  }
  void add(const Tensor& a, const Tensor& b, Tensor y) override {
    same_shape(a, b, "add");
    same_shape(a, y, "add");
    cuda::add(a.as<float>(), b.as<float>(), a.numel(), y.as<float>(), stream_);
  }
  void mul(const Tensor& a, const Tensor& b, Tensor y) override {
    same_shape(a, b, "mul");
    same_shape(a, y, "mul");
    if (y.dtype == DType::BF16) cuda::mul(a.as<float>(), b.as<float>(), a.numel(), y.as<bf16>(), stream_);
    else cuda::mul(a.as<float>(), b.as<float>(), a.numel(), y.as<float>(), stream_);
  }
  void gated_activation(const Tensor& gate, const Tensor& up, const ActivationParams& act, Tensor y) override {
    same_shape(gate, up, "gated_activation");
    same_shape(gate, y, "gated_activation");
    if (y.dtype == DType::BF16)
      cuda::gated_activation(gate.as<float>(), up.as<float>(), gate.numel(), act, y.as<bf16>(), stream_);
    else
      cuda::gated_activation(gate.as<float>(), up.as<float>(), gate.numel(), act, y.as<float>(), stream_);
  }
  void attn_res_mix(const Tensor& prefix, const Tensor& blocks, int n_blocks, const Tensor& w_norm,
                    const Tensor& w_proj, float eps, Tensor out) override {
    same_shape(prefix, out, "attn_res_mix");
    cuda::attn_res_mix(prefix.as<float>(), n_blocks ? blocks.as<float>() : nullptr, n_blocks,
                       static_cast<int>(prefix.rows), static_cast<int>(prefix.cols), w_norm.as<float>(),
                       w_proj.as<float>(), eps, out.as<float>(), stream_);
  }
  void gather_rows(const Tensor& x, const int32_t* rows, Tensor y) override {
    check(x.cols == y.cols && x.dtype == y.dtype, "gather_rows: " + shape(x) + " into " + shape(y));
    cuda::gather_rows(x.data, static_cast<size_t>(x.cols) * dtype_size_bytes(x.dtype), rows, static_cast<int>(y.rows),
                      y.data, stream_);
  }

  // ---- the vision tower --------------------------------------------------------------
  void gelu(const Tensor& x, bool tanh_approx, Tensor y) override {
    is_f32(x, "gelu");
    same_shape(x, y, "gelu");
    if (y.dtype == DType::BF16) cuda::gelu(x.as<float>(), x.numel(), tanh_approx, y.as<bf16>(), stream_);
    else cuda::gelu(x.as<float>(), x.numel(), tanh_approx, y.as<float>(), stream_);
  }
  void vision_attention(const Tensor& qkv, const Tensor& rope, std::span<const int32_t> seq_starts, int num_heads,
                        int head_dim, Tensor out) override {
    is_f32(qkv, "vision_attention");
    is_f32(out, "vision_attention");
    const int64_t width = static_cast<int64_t>(num_heads) * head_dim;
    check(qkv.cols == 3 * width && out.cols == width && rope.cols == head_dim && head_dim % 2 == 0 &&
              head_dim <= cuda::kMaxVisionHeadDim && qkv.rows == out.rows && rope.rows == qkv.rows,
          "vision_attention: qkv " + shape(qkv) + " rope " + shape(rope) + " out " + shape(out));
    check(!seq_starts.empty() && seq_starts.front() == 0 && seq_starts.back() == qkv.rows,
          "vision_attention: the images must cover the rows");
    for (size_t s = 0; s + 1 < seq_starts.size(); ++s)
      cuda::vision_attention(qkv.as<float>(), rope.as<float>(), seq_starts[s], seq_starts[s + 1] - seq_starts[s],
                             num_heads, head_dim, out.as<float>(), stream_);
  }

  // ---- KDA ---------------------------------------------------------------------------
  void short_conv(const Tensor& x, const Tensor& weight, const BatchView& batch, StateLayer window, bool silu,
                  Tensor y) override {
    same_shape(x, y, "short_conv");
    // decode_only: one token a sequence (the runner refuses sequences with none).
    const bool one_token_each = batch.host->decode_only();
    cuda::short_conv(x.as<float>(), static_cast<int>(x.rows), static_cast<int>(x.cols), weight.as<float>(),
                     static_cast<int>(weight.cols), batch.token_seq, batch.seqs, batch.n_seqs(), one_token_each,
                     window.base, window.slot_stride_floats, silu, y.as<float>(), stream_);
  }
  void kda_replay_inputs(const KdaReplayInputs& r, const BatchView& batch) override {
    if (!fused_rollback()) return Ops::kda_replay_inputs(r, batch);
    const int64_t T = r.out[0].rows, D = r.saved[0].cols, H = r.out[4].cols;
    bool ok = r.rows.rows == T && r.rows.dtype == DType::I32 && H > 0 && D == H * r.head_dim &&
              r.saved[4].cols == H && r.window[0].slot_stride_floats == r.window[1].slot_stride_floats &&
              r.window[0].slot_stride_floats == r.window[2].slot_stride_floats && batch.n_tokens() == T;
    for (int i = 0; i < 5; ++i)
      ok = ok && r.saved[i].dtype == DType::F32 && r.out[i].dtype == DType::F32 && r.out[i].rows == T &&
           r.out[i].cols == (i == 4 ? H : D) && r.saved[i].rows == r.saved[0].rows;
    for (int i = 0; i < 3; ++i) ok = ok && r.conv[i].rows == D && r.conv[i].cols == r.conv[0].cols;
    check(ok, "kda_replay_inputs: saved " + shape(r.saved[0]) + ", out " + shape(r.out[0]) + " / " + shape(r.out[4]) +
                  ", rows " + shape(r.rows));
    cuda::KdaReplayInputsArgs a;
    for (int i = 0; i < 5; ++i) a.saved[i] = r.saved[i].as<float>(), a.out[i] = r.out[i].as<float>();
    for (int i = 0; i < 3; ++i) a.conv[i] = r.conv[i].as<float>(), a.window[i] = r.window[i].base;
    a.rows = r.rows.as<int32_t>();
    a.slot_stride = r.window[0].slot_stride_floats;
    a.seqs = batch.seqs;
    a.dim = static_cast<int>(D), a.num_heads = static_cast<int>(H), a.head_dim = r.head_dim;
    a.kernel = static_cast<int>(r.conv[0].cols);
    a.q_scale = r.q_scale;
    cuda::kda_replay_inputs(a, batch.n_seqs(), stream_);
  }
  void l2norm_rows(Tensor x, float scale) override {
    cuda::l2norm_rows(x.as<float>(), x.rows, static_cast<int>(x.cols), scale, stream_);
  }
  void kda_gate(Tensor g, const Tensor& A_log, const Tensor& dt_bias, int head_dim, float lower_bound) override {
    cuda::kda_gate(g.as<float>(), static_cast<int>(g.rows), static_cast<int>(g.cols / head_dim), head_dim,
                   A_log.as<float>(), dt_bias.as<float>(), lower_bound, stream_);
  }
  void sigmoid(Tensor x) override { cuda::sigmoid(x.as<float>(), x.numel(), stream_); }
  void rope_interleaved(Tensor x, const Tensor& cos_sin, int n_heads, int head_width, int rope_offset) override {
    is_f32(x, "rope_interleaved");
    is_f32(cos_sin, "rope_interleaved cos_sin");
    check(cos_sin.rows == x.rows && x.cols == static_cast<int64_t>(n_heads) * head_width &&
              rope_offset + cos_sin.cols <= head_width && cos_sin.cols % 2 == 0,
          "rope_interleaved: x " + shape(x) + ", cos_sin " + shape(cos_sin));
    cuda::rope_interleaved(x.as<float>(), static_cast<int>(x.rows), n_heads, head_width, rope_offset,
                           cos_sin.as<float>(), static_cast<int>(cos_sin.cols), stream_);
  }
  void kda_recurrence(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta,
                      const BatchView& batch, StateLayer state, int num_heads, int head_dim, KdaMode mode,
                      Tensor o) override {
    const int64_t D = static_cast<int64_t>(num_heads) * head_dim;
    check(q.cols == D && beta.cols == num_heads, "kda_recurrence: q " + shape(q) + ", beta " + shape(beta));
    // Short sequences (every one of a decode or speculative verify step) in one launch, token
    // by token; longer ones chunked, one sequence at a time.
    if (mode != KdaMode::kChunked)
      kda_recurrent(q.as<float>(), k.as<float>(), v.as<float>(), g.as<float>(), beta.as<float>(), batch.seqs,
                    batch.n_seqs(), num_heads, head_dim, state.base, state.slot_stride_floats,
                    /*only_short_seqs=*/mode == KdaMode::kAuto, o.as<float>(), stream_);
    if (mode == KdaMode::kRecurrent) return;
    for (const BatchSeq& s : batch.host->seqs) {
      if (mode == KdaMode::kAuto && s.n_new <= kShortSeqMaxNewTokens) continue;
      ScratchScope scope(*this);
      const int64_t off = static_cast<int64_t>(s.token_start) * D;
      if (!float32_ && kda_chunked_mma_supported(head_dim)) {  // bf16 mode: the tensor cores
        Tensor ws = scratch((kda_chunked_mma_workspace_bytes(s.n_new, num_heads, head_dim) + 3) / 4, 1, DType::F32);
        kda_chunked_mma(q.as<float>() + off, k.as<float>() + off, v.as<float>() + off, g.as<float>() + off,
                        beta.as<float>() + static_cast<int64_t>(s.token_start) * num_heads, s.n_new, num_heads,
                        head_dim, state.slot(s.state_slot), o.as<float>() + off, ws.data, stream_);
        continue;
      }
      Tensor ws = scratch(kda_chunked_workspace_floats(s.n_new, num_heads, head_dim), 1, DType::F32);
      kda_chunked(q.as<float>() + off, k.as<float>() + off, v.as<float>() + off, g.as<float>() + off,
                  beta.as<float>() + static_cast<int64_t>(s.token_start) * num_heads, s.n_new, num_heads, head_dim,
                  state.slot(s.state_slot), o.as<float>() + off, ws.as<float>(), stream_);
    }
  }
  void gated_rmsnorm(const Tensor& o, const Tensor& gate, const Tensor& w, float eps, Tensor y) override {
    same_shape(o, gate, "gated_rmsnorm");
    same_shape(o, y, "gated_rmsnorm");
    if (y.dtype == DType::BF16)
      cuda::gated_rmsnorm(o.as<float>(), gate.as<float>(), w.as<float>(), o.rows, static_cast<int>(o.cols), eps,
                          y.as<bf16>(), stream_);
    else
      cuda::gated_rmsnorm(o.as<float>(), gate.as<float>(), w.as<float>(), o.rows, static_cast<int>(o.cols), eps,
                          y.as<float>(), stream_);
  }

  // ---- MLA ---------------------------------------------------------------------------
  void mla_store(const Tensor& ckv, const Tensor& norm_w, float eps, const BatchView& batch, KvLayer cache) override {
    const int L = static_cast<int>(norm_w.numel()), R = static_cast<int>(ckv.cols) - L;
    check(R >= 0 && cache.row_width == L + R, "mla_store: row width");
    cuda::mla_store(ckv.as<float>(), static_cast<int>(ckv.rows), L, R, norm_w.as<float>(), eps, tables(batch), cache,
                    stream_);
  }
  void mla_attention(const Tensor& q, const Matrix& kv_b, const BatchView& batch, KvLayer cache,
                     const MlaShape& shp, MlaMode mode, Tensor o) override {
    const int H = shp.num_heads, T = static_cast<int>(q.rows);
    const int64_t q_width = static_cast<int64_t>(H) * (shp.nope + shp.rope), o_width = static_cast<int64_t>(H) * shp.v_dim;
    check(q.cols == q_width && o.cols == o_width, "mla_attention: q " + shape(q) + ", o " + shape(o));
    check(kv_b.out == H * (shp.nope + shp.v_dim) && kv_b.in == shp.kv_lora && kv_b.kind() == WeightFormat::dense, "mla_attention: kv_b");
    const KvB kvb{kv_b.w.data, kv_b.w.dtype == DType::BF16};
    // Absorbed: every token (kAbsorbed), or the short sequences (kAuto; all of them in a
    // decode or verify step, which a graph captures).
    bool any_short = false;
    for (const BatchSeq& s : batch.host->seqs) any_short = any_short || s.n_new <= kShortSeqMaxNewTokens;
    if (mode == MlaMode::kAbsorbed || (mode == MlaMode::kAuto && any_short)) {
      ScratchScope scope(*this);
      const bool only_single = mode == MlaMode::kAuto;
      Tensor q_abs = scratch(T, static_cast<int64_t>(H) * shp.row_width(), DType::F32);
      Tensor o_lat = scratch(T, static_cast<int64_t>(H) * shp.kv_lora, DType::F32);
      Tensor partials = scratch(static_cast<int64_t>(mla_absorbed_partial_floats(T, H, shp.kv_lora)) + 1, 1, DType::F32);
      mla_absorb_query(q.as<float>(), kvb, T, shp, tables(batch), only_single, q_abs.as<float>(), stream_);
      mla_attend_absorbed(q_abs.as<float>(), T, shp, tables(batch), cache, only_single, !float32_, o_lat.as<float>(),
                          partials.as<float>(), stream_);
      mla_expand_output(o_lat.as<float>(), kvb, T, shp, tables(batch), only_single, o.as<float>(), stream_);
    }
    if (mode == MlaMode::kAbsorbed) return;
    // Plain: one sequence at a time, its keys one block at a time (the prefix's blocks, then
    // the chunk's own keys), each block's kv_b expansion made, used and dropped in turn.
    const bool tensor_cores = !float32_ && wgmma_ && mla_wgmma_prefill_supported(shp);
    for (const BatchSeq& s : batch.host->seqs) {
      if (mode == MlaMode::kAuto && s.n_new <= kShortSeqMaxNewTokens) continue;
      ScratchScope scope(*this);
      const int32_t* pages = batch.page_table + s.page_start;
      const float* qs = q.as<float>() + s.token_start * q_width;
      float* os = o.as<float>() + s.token_start * o_width;
      const int kv_width = H * (shp.nope + shp.v_dim);
      Tensor lse = scratch(s.n_new, H, DType::F32);  // [n_new, H] over the blocks so far
      Tensor q_tiles;
      if (tensor_cores) {
        q_tiles = scratch(static_cast<int64_t>(mla_wgmma_q_tiles_bytes(s.n_new, H)), 1, DType::U8);
        mla_wgmma_pack_q(qs, s.n_new, H, q_tiles.data, stream_);
      }
      const int block = mla_prefill_key_block(s.n_new);
      bool first = true;
      for (int k0 = 0; k0 < s.n_past + s.n_new;) {
        const int k1 = k0 < s.n_past ? std::min(k0 + block, s.n_past) : s.n_past + s.n_new;
        const int nb = k1 - k0;
        ScratchScope block_scope(*this);
        if (tensor_cores) {
          Tensor latents = scratch(nb, shp.kv_lora, DType::BF16);
          Tensor kpe = scratch(nb, shp.rope, DType::BF16);
          mla_gather_latents(cache, pages, k0, nb, shp.kv_lora, true, latents.data, kpe.as<bf16>(), stream_);
          Tensor kv16 = scratch(nb, kv_width, DType::BF16);
          linear(latents, kv_b, kv16);
          Tensor tiles = scratch(static_cast<int64_t>(mla_wgmma_kv_tiles_bytes(nb, H)), 1, DType::U8);
          mla_wgmma_pack_kv(kv16.as<bf16>(), kpe.as<bf16>(), nb, shp, tiles.data, stream_);
          mla_wgmma_attend(q_tiles.data, tiles.data, s.n_new, nb, s.n_past - k0, first, shp, os, lse.as<float>(),
                           stream_);
        } else {
          // Into o directly for the first block, else beside it and merged.
          Tensor o_blk = first ? Tensor{} : scratch(s.n_new, o_width, DType::F32);
          Tensor lse_blk = first ? Tensor{} : scratch(s.n_new, H, DType::F32);
          float* ob = first ? os : o_blk.as<float>();
          float* lb = first ? lse.as<float>() : lse_blk.as<float>();
          Tensor latents = scratch(nb, shp.kv_lora, act_dtype());
          mla_gather_latents(cache, pages, k0, nb, shp.kv_lora, act_dtype() == DType::BF16, latents.data, nullptr,
                             stream_);
          if (!float32_ && mla_flash_prefill_mma_supported(shp)) {
            Tensor kv16 = scratch(nb, kv_width, DType::BF16);
            linear(latents, kv_b, kv16);
            mla_flash_prefill_mma(qs, kv16.as<bf16>(), cache, pages, s.n_new, s.n_past, k0, nb, shp, ob, lb, stream_);
          } else {
            Tensor kv = scratch(nb, kv_width, DType::F32);
            linear(latents, kv_b, kv);
            Tensor partials =
                scratch(static_cast<int64_t>(mla_plain_partial_floats(s.n_new, H, nb, shp.v_dim)) + 1, 1, DType::F32);
            mla_attend_plain(qs, kv.as<float>(), cache, pages, s.n_new, s.n_past, k0, nb, shp, ob, lb,
                             partials.as<float>(), stream_);
          }
          if (!first)
            mla_merge_blocks(os, lse.as<float>(), ob, lb, static_cast<int64_t>(s.n_new) * H, shp.v_dim, stream_);
        }
        first = false;
        k0 = k1;
      }
    }
  }

  // ---- DSA (K3.1's full-attention layers; issue 38) --------------------------------------
  // Reference kernels first (cuda/mla/dsa_ops.cu): fp32, the indexer-key pool F32 as on the
  // CPU, and the attention over the selection absorbed (the cache rows are keys and values),
  // whatever `mode` asks: prefill reads at most index_topk rows a query, like a decode.
  void dsa_index_store(const Tensor& k, const Tensor& norm_w, const Tensor& norm_b, float eps, const BatchView& batch,
                       KvLayer cache) override {
    const int D = static_cast<int>(k.cols);
    check(index_pool_ok(cache, D), "dsa_index_store: an F32 pool of rows of " + std::to_string(D) + " or an FP8 one of " +
                                       std::to_string(dsa_fp8_row_width(D)) + " (D a multiple of 4)");
    check(norm_w.numel() == D && norm_b.numel() == D && k.rows == batch.n_tokens(), "dsa_index_store shapes");
    cuda::dsa_index_store(k.as<float>(), static_cast<int>(k.rows), D, norm_w.as<float>(), norm_b.as<float>(), eps,
                          tables(batch), cache, stream_);
  }
  void dsa_index_scores(const Tensor& q, const Tensor& weights, const BatchView& batch, KvLayer cache,
                        const DsaIndexerShape& shp, Tensor scores, int first_token) override {
    const int H = shp.num_heads, D = shp.head_dim;
    check(q.cols == static_cast<int64_t>(H) * D && weights.cols == H && first_token >= 0 &&
              first_token + q.rows <= batch.n_tokens() && weights.rows == q.rows && scores.rows == q.rows,
          "dsa_index_scores shapes");
    check(index_pool_ok(cache, D), "dsa_index_scores: an F32 pool of rows of " + std::to_string(D) + " or an FP8 one of " +
                                       std::to_string(dsa_fp8_row_width(D)) + " (D a multiple of 4)");
    for (const BatchSeq& s : batch.host->seqs)
      check(s.n_past + s.n_new <= scores.cols, "dsa_index_scores: scores narrower than a sequence's positions");
    cuda::dsa_index_scores(q.as<float>(), weights.as<float>(), first_token, static_cast<int>(q.rows), H, D,
                           shp.weight_scale(), tables(batch), cache, !float32_, scores.as<float>(), scores.cols,
                           stream_);
  }
  void dsa_topk(const Tensor& scores, const BatchView& batch, Tensor indices, int first_token) override {
    check(indices.dtype == DType::I32 && first_token >= 0 && first_token + indices.rows <= batch.n_tokens() &&
              scores.rows == indices.rows && indices.cols > 0,
          "dsa_topk shapes");
    const int T = static_cast<int>(scores.rows), k = static_cast<int>(indices.cols);
    ScratchScope scope(*this);
    const size_t ws = cuda::dsa_topk_workspace_bytes(T, scores.cols, k);
    Tensor workspace = ws > 0 ? scratch(static_cast<int64_t>(ws), 1, DType::U8) : Tensor{};
    cuda::dsa_topk(scores.as<float>(), first_token, T, scores.cols, tables(batch), k, indices.as<int32_t>(),
                   ws > 0 ? workspace.data : nullptr, stream_);
  }
  void mla_sparse_attention(const Tensor& q, const Matrix& kv_b, const BatchView& batch, KvLayer cache,
                            const MlaShape& shp, MlaMode, const Tensor& indices, Tensor o) override {
    const int H = shp.num_heads, T = static_cast<int>(q.rows);
    check(q.cols == static_cast<int64_t>(H) * (shp.nope + shp.rope) && o.cols == static_cast<int64_t>(H) * shp.v_dim,
          "mla_sparse_attention: q " + shape(q) + ", o " + shape(o));
    check(kv_b.out == H * (shp.nope + shp.v_dim) && kv_b.in == shp.kv_lora && kv_b.kind() == WeightFormat::dense,
          "mla_sparse_attention: kv_b");
    check(indices.dtype == DType::I32 && indices.rows == q.rows && indices.cols > 0, "mla_sparse_attention: indices");
    const KvB kvb{kv_b.w.data, kv_b.w.dtype == DType::BF16};
    ScratchScope scope(*this);
    Tensor q_abs = scratch(T, static_cast<int64_t>(H) * shp.row_width(), DType::F32);
    Tensor o_lat = scratch(T, static_cast<int64_t>(H) * shp.kv_lora, DType::F32);
    const int k = static_cast<int>(indices.cols);
    Tensor partials = scratch(static_cast<int64_t>(mla_sparse_partial_floats(T, H, shp.kv_lora, k)) + 1, 1, DType::F32);
    mla_absorb_query(q.as<float>(), kvb, T, shp, tables(batch), false, q_abs.as<float>(), stream_);
    mla_attend_sparse(q_abs.as<float>(), T, shp, tables(batch), cache, indices.as<int32_t>(), k, !float32_,
                      o_lat.as<float>(), partials.as<float>(), stream_);
    mla_expand_output(o_lat.as<float>(), kvb, T, shp, tables(batch), false, o.as<float>(), stream_);
  }

  // ---- MoE ---------------------------------------------------------------------------
  void repack_experts(ExpertMatrices& m) override {
    if (m.stacked.int4()) {
      // The re-laid words come in 64-wide slices; other widths stay as stored (reference kernel).
      if (!int4_fast() || m.stacked.backend_layout || m.stacked.in % 64 != 0) return;
      repack_int4_words(m.stacked.w.data, m.stacked.w.nbytes(), stream_);
      CUDA_CHECK(cudaStreamSynchronize(stream_));
      m.stacked.backend_layout = true;
      return;
    }
    if (!m.stacked.mxfp4()) return;
    repack_mxfp4_codes(m.stacked.w.data, m.stacked.w.nbytes(), stream_);
    CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  void router_topk(const Tensor& logits, const Tensor& bias, const RouterParams& p, Tensor ids,
                   Tensor weights) override {
    check(logits.cols == p.num_experts && ids.cols == p.top_k && ids.dtype == DType::I32, "router_topk shapes");
    cuda::router_topk(logits.as<float>(), bias.empty() ? nullptr : bias.as<float>(), static_cast<int>(logits.rows), p,
                      ids.as<int32_t>(), weights.as<float>(), stream_);
  }
  void moe_experts(const Tensor& x, const Tensor& ids, const Tensor& weights, const ExpertMatrices& w1,
                   const ExpertMatrices& w3, const ExpertMatrices& w2, const ActivationParams& act,
                   Tensor y) override {
    const int T = static_cast<int>(x.rows), K = static_cast<int>(ids.cols), E = w1.num_experts;
    const int inter = w1.stacked.out, D = static_cast<int>(x.cols), n_slots = T * K;
    check(w1.stacked.in == D && w2.stacked.out == D && w2.stacked.in == inter, "moe_experts shapes");
    check(E > 0, "moe_experts: no experts");
    if (T == 0) return;
    ScratchScope scope(*this);
    ExpertGroups groups;
    groups.offsets = scratch(E + 1, 1, DType::I32).as<int>();
    groups.perm = scratch(n_slots, 1, DType::I32).as<int>();
    groups.active = scratch(E, 1, DType::I32).as<int>();
    groups.num_active = scratch(1, 1, DType::I32).as<int>();
    group_by_expert(ids.as<int32_t>(), n_slots, w1.first_expert, E, groups, stream_);
    const int max_active = std::min(E, n_slots);
    const bool x_bf16 = x.dtype == DType::BF16;
    Tensor h = scratch(n_slots, inter, x.dtype);
    Tensor out = scratch(n_slots, D, DType::F32);  // slots of other ranks' experts: not written, not read
    const StackedExperts s1 = stacked(w1), s3 = stacked(w3), s2 = stacked(w2);
    if (grouped_mxfp4_stream_gated_supported(s1, s3, x_bf16, T, x.data) &&
        grouped_mxfp4_stream_supported(s2, x_bf16, T, h.data)) {
      // Decode: gate and up in one launch that stores h = act(gate, up) itself; the down
      // launch copies its weight tiles while that one finishes (the groups are older).
      grouped_mxfp4_stream_gated(x.as<bf16>(), K, s1, s3, act, groups, max_active, T, h.as<bf16>(), stream_);
      grouped_mxfp4_stream(h.as<bf16>(), 1, s2, groups, max_active, T, out.as<float>(), stream_,
                           /*overlap_previous=*/true);
    } else {
      Tensor g = scratch(n_slots, inter, DType::F32), u = scratch(n_slots, inter, DType::F32);
      grouped_expert_linear(x.data, x_bf16, K, s1, groups, max_active, T, g.as<float>(), stream_);
      grouped_expert_linear(x.data, x_bf16, K, s3, groups, max_active, T, u.as<float>(), stream_);
      gated_activation(g, u, act, h);
      grouped_expert_linear(h.data, x_bf16, 1, s2, groups, max_active, T, out.as<float>(), stream_);
    }
    combine_experts(out.as<float>(), weights.as<float>(), ids.as<int32_t>(), w1.first_expert, E, T, K, D,
                    y.as<float>(), stream_);
  }

  // ---- sampling ----------------------------------------------------------------------
  void dspark_markov(Tensor logits, const Tensor& w1, const Tensor& w2, const int32_t* ids, int block, int n_slots,
                     const Tensor& h, const Tensor& conf_w, float conf_b, Tensor tokens, Tensor conf) override {
    is_f32(logits, "dspark_markov");
    const int64_t V = logits.cols, r = w1.cols;
    check(block > 0 && logits.rows % block == 0 && n_slots >= 0 && n_slots <= block && w1.rows == V && w2.rows == V &&
              w2.cols == r && r <= 1024 && tokens.rows == logits.rows && tokens.dtype == DType::I32,
          "dspark_markov: logits " + shape(logits) + ", w1 " + shape(w1) + ", w2 " + shape(w2) + ", tokens " +
              shape(tokens));
    const bool with_conf = !conf_w.empty();
    check(!with_conf || ((conf_w.cols == h.cols || conf_w.cols == h.cols + r) && h.rows == logits.rows &&
                         conf.rows == logits.rows),
          "dspark_markov: confidence weights " + shape(conf_w) + ", h " + shape(h));
    ScratchScope scope(*this);
    const int n_blocks = static_cast<int>(logits.rows / block);
    const Tensor part = scratch((cuda::dspark_markov_scratch_bytes(n_blocks, static_cast<int>(V)) + 3) / 4, 1, DType::I32);
    cuda::dspark_markov(logits.as<float>(), n_blocks, static_cast<int>(V), w1.as<float>(),
                        w2.as<float>(), static_cast<int>(r), ids, block, n_slots,
                        with_conf ? h.as<float>() : nullptr, static_cast<int>(h.cols),
                        with_conf ? conf_w.as<float>() : nullptr, static_cast<int>(conf_w.cols), conf_b,
                        tokens.as<int32_t>(), with_conf ? conf.as<float>() : nullptr, part.data, stream_);
  }
  void sample(const Tensor& logits, const SamplingBatch& rows, std::vector<SampleResult>& out) override {
    const int R = static_cast<int>(rows.rows.size()), V = static_cast<int>(logits.cols);
    check(logits.rows == R && logits.dtype == DType::F32, "sample: one F32 logits row per rule");
    out.assign(R, SampleResult{});
    if (R == 0) return;
    // Logprobs come from the raw rows: copied out before the edits, only for rows that ask.
    std::vector<float> raw;
    for (int r = 0; r < R; ++r) {
      if (rows.rows[r].logprobs < 0) continue;
      raw.resize(V);
      download(logits.rows_view(r, 1), raw.data());
      out[r].logprob = 0;  // filled below, once the token is known
      raw_rows_.emplace_back(r, raw);
    }
    ScratchScope scope(*this);
    bool edits = !rows.history.empty() || !rows.biases.empty() || !rows.allowed.empty();
    if (edits) {
      std::vector<DeviceRowEdits> e(R);
      for (int r = 0; r < R; ++r) {
        const SamplingRow& s = rows.rows[r];
        e[r] = DeviceRowEdits{s.history_begin, s.history_end, s.bias_begin, s.bias_end, s.mask_row,
                              s.repetition_penalty, s.frequency_penalty, s.presence_penalty};
      }
      auto put = [&](const void* src, size_t bytes) {
        Tensor t = scratch(static_cast<int64_t>((bytes + 3) / 4) + 1, 1, DType::I32);
        if (bytes) CUDA_CHECK(cudaMemcpyAsync(t.data, src, bytes, cudaMemcpyHostToDevice, stream_));
        return t.data;
      };
      const void* d_rows = put(e.data(), e.size() * sizeof(DeviceRowEdits));
      const void* d_hist = put(rows.history.data(), rows.history.size() * sizeof(TokenCount));
      const void* d_bias = put(rows.biases.data(), rows.biases.size() * sizeof(TokenBias));
      const void* d_mask = put(rows.allowed.data(), rows.allowed.size() * sizeof(uint32_t));
      apply_logit_edits(logits.as<float>(), R, V, static_cast<const DeviceRowEdits*>(d_rows),
                        static_cast<const TokenCount*>(d_hist), static_cast<const TokenBias*>(d_bias),
                        static_cast<const uint32_t*>(d_mask), rows.mask_words, stream_);
    }
    // Host side of the step's copies: the parameters (non-greedy batches) and the ids back.
    bool all_greedy = true;
    for (const SamplingRow& s : rows.rows) all_greedy = all_greedy && s.greedy();
    const size_t params_bytes = all_greedy ? 0 : R * sizeof(DeviceSamplingParams);
    const size_t ids_offset = (params_bytes + 15) / 16 * 16;
    char* host = sample_staging(ids_offset + R * sizeof(int32_t));
    Tensor ids = scratch(R, 1, DType::I32);
    if (all_greedy) {
      // The common decode case: no parameters to upload, a many-block argmax (argmax.cu).
      Tensor partials = scratch(2 * static_cast<int64_t>(argmax_partials(R, V)) + 1, 1, DType::I32);
      argmax_rows(logits.as<float>(), R, V, static_cast<ArgmaxPartial*>(partials.data), ids.as<int32_t>(), stream_);
    } else {
      auto* params = reinterpret_cast<DeviceSamplingParams*>(host);
      for (int r = 0; r < R; ++r) {
        const SamplingRow& s = rows.rows[r];
        params[r] = DeviceSamplingParams{s.temperature, s.top_k, s.top_p, s.min_p, s.u};
      }
      Tensor d_params = scratch(static_cast<int64_t>(params_bytes / 4) + 1, 1, DType::I32);
      CUDA_CHECK(cudaMemcpyAsync(d_params.data, params, params_bytes, cudaMemcpyHostToDevice, stream_));
      sample_rows(logits.as<float>(), R, V, static_cast<const DeviceSamplingParams*>(d_params.data),
                  ids.as<int32_t>(), stream_);
    }
    // Only the ids come back (R x 4 bytes), into pinned memory.
    int32_t* host_ids = reinterpret_cast<int32_t*>(host + ids_offset);
    CUDA_CHECK(cudaMemcpyAsync(host_ids, ids.data, R * sizeof(int32_t), cudaMemcpyDeviceToHost, stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    for (int r = 0; r < R; ++r) out[r].token = host_ids[r];
    for (auto& [r, row] : raw_rows_) cpu::add_logprobs(row.data(), V, rows.rows[r].logprobs, out[r]);
    raw_rows_.clear();
  }

  // ---- execution ---------------------------------------------------------------------
  // ---- collectives (NCCL, nccl_comm.h; none at one rank) -----------------------------
  void all_reduce_sum(Tensor x) override {
    is_f32(x, "all_reduce_sum");
    if (comm_) with_prefetch([&] { comm_->all_reduce_sum(x.as<float>(), static_cast<size_t>(x.numel())); });
  }
  // Ops::prefetch_during_next_collective: the leading MOONRUN_L2_PREFETCH_MB of the weights
  // (none when unset or 0, or without a group), kept for the next collective.
  void prefetch_during_next_collective(std::span<const Tensor> weights) override {
    prefetch_.n = 0;
    if (l2_prefetch_bytes_ <= 0 || !comm_ || comm_->size() < 2) return;
    int64_t left = l2_prefetch_bytes_;
    for (const Tensor& w : weights) {
      if (w.empty() || left <= 0 || prefetch_.n == cuda::kMaxL2PrefetchRanges) continue;
      const int64_t b = std::min<int64_t>(static_cast<int64_t>(w.nbytes()), left);
      prefetch_.ptr[prefetch_.n] = w.data;
      prefetch_.bytes[prefetch_.n++] = b;
      left -= b;
    }
  }
  void all_gather_cols(const Tensor& x, Tensor out) override {
    const Tensor parts[] = {x};
    Tensor outs[] = {out};
    all_gather_cols_packed(parts, outs);
  }
  void all_gather_cols_packed(std::span<const Tensor> parts, std::span<Tensor> outs) override {
    const int W = parallel_size();
    check(parts.size() == outs.size() && !parts.empty(), "all_gather_cols_packed: parts and outputs differ");
    size_t n = 0;
    for (size_t i = 0; i < parts.size(); ++i) {
      is_f32(parts[i], "all_gather_cols_packed");
      check(outs[i].rows == parts[i].rows && outs[i].cols == W * parts[i].cols,
            "all_gather_cols_packed: output " + shape(outs[i]));
      check(parts[i].as<float>() == parts[0].as<float>() + n, "all_gather_cols_packed: parts not one after another");
      n += static_cast<size_t>(parts[i].numel());
    }
    if (W == 1) {
      for (size_t i = 0; i < parts.size(); ++i) copy(parts[i], outs[i]);
      return;
    }
    // NCCL gathers rank-major [W, n]; each rank's block holds its parts one after another.
    const size_t mark = scratch_mark();
    Tensor gathered = scratch(W, static_cast<int64_t>(n), DType::F32);
    with_prefetch([&] { comm_->all_gather(parts[0].as<float>(), n, gathered.as<float>()); });
    size_t offset = 0;
    for (size_t i = 0; i < parts.size(); ++i) {
      const Tensor &x = parts[i], &out = outs[i];
      const size_t row_bytes = static_cast<size_t>(x.cols) * sizeof(float);
      for (int r = 0; r < W; ++r)
        CUDA_CHECK(cudaMemcpy2DAsync(out.as<float>() + static_cast<int64_t>(r) * x.cols, out.cols * sizeof(float),
                                     gathered.as<float>() + static_cast<int64_t>(r) * n + offset, row_bytes, row_bytes,
                                     x.rows, cudaMemcpyDeviceToDevice, stream_));
      offset += static_cast<size_t>(x.numel());
    }
    scratch_rewind(mark);
  }
  int parallel_rank() const override { return comm_ ? comm_->rank() : 0; }
  int parallel_size() const override { return comm_ ? comm_->size() : 1; }
  void set_pipeline(std::unique_ptr<Communicator> prev, std::unique_ptr<Communicator> next) override {
    pipe_prev_ = std::move(prev);
    pipe_next_ = std::move(next);
    if (pipe_prev_) pipe_prev_->bind_stream(stream_);
    if (pipe_next_) pipe_next_->bind_stream(stream_);
  }
  void pipe_send(const Tensor& x) override {
    is_f32(x, "pipe_send");
    if (!pipe_next_) throw BackendError("pipe_send: this rank has no next stage");
    pipe_next_->broadcast(const_cast<float*>(x.as<float>()), static_cast<size_t>(x.numel()), pipe_next_->rank());
  }
  void pipe_recv(Tensor x) override {
    is_f32(x, "pipe_recv");
    if (!pipe_prev_) throw BackendError("pipe_recv: this rank has no previous stage");
    pipe_prev_->broadcast(x.as<float>(), static_cast<size_t>(x.numel()), 1 - pipe_prev_->rank());
  }
  void abort_collectives(const std::string& why) override {
    if (comm_) comm_->abort(why);
    if (pipe_prev_) pipe_prev_->abort(why);
    if (pipe_next_) pipe_next_->abort(why);
  }
  void bind_thread() override { CUDA_CHECK(cudaSetDevice(device_)); }

  void synchronize() override { CUDA_CHECK(cudaStreamSynchronize(stream_)); }
  bool captures() const override { return true; }
  std::unique_ptr<Ops> make_lane(size_t scratch_bytes, std::unique_ptr<Communicator> comm) override {
    // A communicator's collectives are issued on one stream in one order: a group's lane
    // needs a group of its own (comm, bound to the lane's stream); pipeline pairs have none.
    if (lane_ || pipe_prev_ || pipe_next_ || (comm_ && comm_->size() > 1 && !comm)) return nullptr;
    CUDA_CHECK(cudaSetDevice(device_));
    void* base = arena_->alloc_bytes(scratch_bytes, "prefill lane scratch");
    return std::unique_ptr<Ops>(
        new CudaOps(options_, std::make_unique<DeviceArena>(base, scratch_bytes), std::move(comm), /*lane=*/true));
  }
  void run_captured(uint64_t key, const std::function<void()>& body) override {
    auto it = graphs_.find(key);
    if (it == graphs_.end()) {
      CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
      try {
        body();
      } catch (...) {
        cudaGraph_t broken = nullptr;
        cudaStreamEndCapture(stream_, &broken);
        if (broken) cudaGraphDestroy(broken);
        throw;
      }
      cudaGraph_t graph = nullptr;
      CUDA_CHECK(cudaStreamEndCapture(stream_, &graph));
      cudaGraphExec_t exec = nullptr;
      const cudaError_t st = cudaGraphInstantiate(&exec, graph, 0);
      cudaGraphDestroy(graph);
      CUDA_CHECK(st);
      it = graphs_.emplace(key, exec).first;
    }
    CUDA_CHECK(cudaGraphLaunch(it->second, stream_));
  }

 private:
  void grow_blob(Staging& st, size_t words) {
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    const size_t cap = std::max<size_t>(words * 2, size_t{1} << 16);
    if (st.host) cudaFreeHost(st.host);
    if (st.device) cudaFree(st.device);
    st.host = nullptr;
    st.device = nullptr;
    CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&st.host), cap * sizeof(int32_t)));
    CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&st.device), cap * sizeof(int32_t)));
    st.words = cap;
    // The tables moved: graphs recorded with the old addresses are void.
    for (auto& [key, exec] : graphs_) cudaGraphExecDestroy(exec);
    graphs_.clear();
  }

  // A collective with the pending L2 prefetch beside it: the prefetch kernel on a side
  // stream forked from this one before the collective is enqueued and joined after it (so a
  // captured graph holds both, and the step's next kernel waits for neither longer than the
  // collective itself takes, as the prefetch only issues requests).
  template <class F>
  void with_prefetch(F&& collective) {
    if (prefetch_.n == 0) {
      collective();
      return;
    }
    if (!prefetch_stream_) {
      int least = 0, greatest = 0;
      CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
      CUDA_CHECK(cudaStreamCreateWithPriority(&prefetch_stream_, cudaStreamNonBlocking, lane_ ? least : greatest));
      CUDA_CHECK(cudaEventCreateWithFlags(&prefetch_fork_, cudaEventDisableTiming));
      CUDA_CHECK(cudaEventCreateWithFlags(&prefetch_join_, cudaEventDisableTiming));
    }
    CUDA_CHECK(cudaEventRecord(prefetch_fork_, stream_));
    CUDA_CHECK(cudaStreamWaitEvent(prefetch_stream_, prefetch_fork_, 0));
    cuda::l2_prefetch(prefetch_, prefetch_stream_);
    CUDA_CHECK(cudaEventRecord(prefetch_join_, prefetch_stream_));
    prefetch_.n = 0;
    collective();
    CUDA_CHECK(cudaStreamWaitEvent(stream_, prefetch_join_, 0));
  }

  static int64_t l2_prefetch_bytes_from_env() {
    const char* v = std::getenv("MOONRUN_L2_PREFETCH_MB");
    return v ? static_cast<int64_t>(std::atof(v) * 1024 * 1024) : 0;
  }

  // Pinned host memory for sample()'s copies, at least `bytes`: a pageable cudaMemcpyAsync
  // goes through a driver staging buffer (and may wait for the stream), a pinned one is one
  // DMA. Every sample() ends in a stream synchronisation, so the buffer is free on entry.
  char* sample_staging(size_t bytes) {
    if (bytes > sample_staging_bytes_) {
      if (sample_staging_) CUDA_CHECK(cudaFreeHost(sample_staging_));
      sample_staging_ = nullptr;
      sample_staging_bytes_ = 0;
      const size_t cap = std::max<size_t>(bytes * 2, 4096);
      CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&sample_staging_), cap));
      sample_staging_bytes_ = cap;
    }
    return sample_staging_;
  }

  CudaOpsOptions options_;
  int device_;
  bool float32_;
  bool lane_ = false;   // make_lane's: scratch only, the lowest stream priority
  bool wgmma_ = false;  // sm_90a machine code runs here (common/wgmma.cuh)
  std::unique_ptr<DeviceArena> arena_;  // a lane's: a view of its scratch block in the parent's
  std::unique_ptr<Communicator> comm_;  // the rank's NCCL communicator; none at one rank
  std::unique_ptr<Communicator> pipe_prev_, pipe_next_;  // set_pipeline: NCCL pairs
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<Blas> blas_;
  Staging staging_[kBatchAreas];
  std::map<uint64_t, cudaGraphExec_t> graphs_;
  std::vector<std::pair<int, std::vector<float>>> raw_rows_;  // sample(): rows asking for logprobs
  char* sample_staging_ = nullptr;  // pinned, sample_staging()
  size_t sample_staging_bytes_ = 0;
  // prefetch_during_next_collective: the budget, the pending ranges, the side stream.
  int64_t l2_prefetch_bytes_ = l2_prefetch_bytes_from_env();
  cuda::L2PrefetchRanges prefetch_;
  cudaStream_t prefetch_stream_ = nullptr;
  cudaEvent_t prefetch_fork_ = nullptr, prefetch_join_ = nullptr;
};

Result<std::unique_ptr<Ops>> make_cuda_ops(const CudaOpsOptions& o, std::unique_ptr<Communicator> comm) {
  int n_devices = 0;
  if (cudaGetDeviceCount(&n_devices) != cudaSuccess || n_devices == 0) {
    (void)cudaGetLastError();
    return failed_precondition("--device cuda: no CUDA device is visible (driver missing or no GPU); use --device cpu");
  }
  if (o.device < 0 || o.device >= n_devices)
    return invalid_argument("CUDA device " + std::to_string(o.device) + " does not exist (" +
                            std::to_string(n_devices) + " visible)");
  if (!(o.mem_fraction_static > 0 && o.mem_fraction_static < 1))
    return invalid_argument("--mem-fraction-static must be in (0, 1), got " + std::to_string(o.mem_fraction_static));
  try {
    CUDA_CHECK(cudaSetDevice(o.device));
    size_t free_bytes = 0, total_bytes = 0;
    CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
    // SGLang's meaning: the static pools (weights + KV) take this fraction of the card. What
    // other processes hold is not ours to take, so the arena also stays under what is free.
    const size_t want = static_cast<size_t>(o.mem_fraction_static * static_cast<double>(total_bytes));
    const size_t arena = std::min(want, free_bytes > kHeadroomBytes ? free_bytes - kHeadroomBytes : 0);
    if (arena == 0) return resource_exhausted("no free memory on CUDA device " + std::to_string(o.device));
    return std::unique_ptr<Ops>(new CudaOps(o, arena, std::move(comm)));
  } catch (const CudaError& e) {
    return resource_exhausted(std::string("setting up CUDA device ") + std::to_string(o.device) + ": " + e.what());
  }
}

}  // namespace moonrun::cuda
