#include "backend/cpu/cpu_ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "backend/cpu/activations.h"
#include "backend/cpu/attn_res.h"
#include "backend/cpu/dsa.h"
#include "backend/cpu/kda.h"
#include "backend/cpu/linear.h"
#include "backend/cpu/mla.h"
#include "backend/cpu/moe.h"
#include "backend/cpu/int4.h"
#include "backend/cpu/mxfp4.h"
#include "backend/cpu/router.h"
#include "backend/cpu/sample.h"
#include "backend/cpu/vision.h"
#include "backend/dsa_index_row.h"

namespace moonrun::cpu {

namespace {

constexpr size_t kAlign = 64;
constexpr size_t kMinScratchBlock = size_t{16} << 20;

size_t align_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

float* f32(const Tensor& t) {
  MR_CHECK(t.dtype == DType::F32) << "CPU op on a " << dtype_name(t.dtype) << " tensor (the CPU backend is F32)";
  return t.as<float>();
}

void check_same_shape(const Tensor& a, const Tensor& b, const char* op) {
  MR_CHECK(a.rows == b.rows && a.cols == b.cols)
      << op << ": [" << a.rows << ", " << a.cols << "] vs [" << b.rows << ", " << b.cols << "]";
}

}  // namespace

CpuOps::CpuOps(std::unique_ptr<Communicator> comm) : comm_(std::move(comm)) {}
CpuOps::~CpuOps() = default;

Tensor CpuOps::alloc(int64_t rows, int64_t cols, DType dtype, const char* what) {
  Tensor t{nullptr, dtype, rows, cols};
  const size_t bytes = std::max<size_t>(t.nbytes(), 1);
  try {
    persistent_.emplace_back(new char[bytes]());  // zero-filled
  } catch (const std::bad_alloc&) {
    throw BackendError(std::string("out of host memory allocating ") + what + " (" + std::to_string(bytes) +
                       " bytes)");
  }
  allocated_bytes_ += bytes;
  t.data = persistent_.back().get();
  return t;
}

void CpuOps::upload(const Tensor& t, size_t offset_bytes, const void* host, size_t bytes) {
  MR_CHECK(offset_bytes + bytes <= t.nbytes()) << "upload past the tensor's end";
  std::memcpy(static_cast<char*>(t.data) + offset_bytes, host, bytes);
}

void CpuOps::download(const Tensor& t, void* host) { std::memcpy(host, t.data, t.nbytes()); }

void CpuOps::zero(const Tensor& t) { std::memset(t.data, 0, t.nbytes()); }

void CpuOps::copy(const Tensor& src, const Tensor& dst) {
  check_same_shape(src, dst, "copy");
  MR_CHECK(src.dtype == dst.dtype) << "CPU copy between dtypes";
  std::memmove(dst.data, src.data, src.nbytes());
}

void CpuOps::copy_cols(const Tensor& src, int64_t src_col, const Tensor& dst, int64_t dst_col, int64_t n_cols) {
  MR_CHECK(src.dtype == dst.dtype && src.rows == dst.rows && src_col >= 0 && dst_col >= 0 && n_cols >= 0 &&
           src_col + n_cols <= src.cols && dst_col + n_cols <= dst.cols)
      << "copy_cols: [" << src.rows << ", " << src.cols << "] cols " << src_col << "+" << n_cols << " -> ["
      << dst.rows << ", " << dst.cols << "] col " << dst_col;
  const size_t es = dtype_size_bytes(src.dtype);
  for (int64_t r = 0; r < src.rows; ++r)
    std::memmove(static_cast<char*>(dst.data) + (r * dst.cols + dst_col) * es,
                 static_cast<const char*>(src.data) + (r * src.cols + src_col) * es, static_cast<size_t>(n_cols) * es);
}

Tensor CpuOps::scratch(int64_t rows, int64_t cols, DType dtype) {
  Tensor t{nullptr, dtype, rows, cols};
  const size_t bytes = align_up(std::max<size_t>(t.nbytes(), 1));
  if (scratch_blocks_.empty() ||
      scratch_used_ + bytes > scratch_blocks_.back().begin + scratch_blocks_.back().size) {
    Block b;
    b.size = std::max({bytes, kMinScratchBlock, scratch_blocks_.empty() ? 0 : 2 * scratch_blocks_.back().size});
    b.bytes.reset(new char[b.size]);
    b.begin = scratch_used_;
    scratch_blocks_.push_back(std::move(b));
  }
  const Block& b = scratch_blocks_.back();
  t.data = b.bytes.get() + (scratch_used_ - b.begin);
  scratch_used_ += bytes;
  scratch_high_water_ = std::max(scratch_high_water_, scratch_used_);
  return t;
}

void CpuOps::scratch_rewind(size_t mark) {
  MR_CHECK(mark <= scratch_used_) << "scratch rewind forward";
  while (scratch_blocks_.size() > 1 && scratch_blocks_.back().begin >= mark) scratch_blocks_.pop_back();
  scratch_used_ = mark;
}

void CpuOps::reset_scratch() {
  scratch_used_ = 0;
  // One block that held the last step's peak: later steps of that size need no new block.
  if (scratch_blocks_.size() > 1 || (!scratch_blocks_.empty() && scratch_blocks_[0].size < scratch_high_water_)) {
    scratch_blocks_.clear();
    Block b;
    b.size = std::max(align_up(scratch_high_water_ + scratch_high_water_ / 4), kMinScratchBlock);
    b.bytes.reset(new char[b.size]);
    scratch_blocks_.push_back(std::move(b));
  }
}

BatchView CpuOps::upload_batch(const ForwardBatch& batch, int /*area: the host tables are read in place*/) {
  BatchView v;
  v.host = &batch;
  v.token_ids = batch.token_ids.data();
  v.positions = batch.positions.data();
  v.token_seq = batch.token_seq.data();
  v.seqs = batch.seqs.data();
  v.page_table = batch.page_table.data();
  v.logit_rows = batch.logit_rows.data();
  return v;
}

// ---- dense ---------------------------------------------------------------------------

void CpuOps::embedding(const Tensor& table, int64_t first_row, const BatchView& batch, Tensor out) {
  const int64_t H = table.cols;
  MR_CHECK(out.rows == batch.n_tokens() && out.cols == H) << "embedding output shape";
  const float* tab = f32(table);
  float* o = f32(out);
  for (int t = 0; t < batch.n_tokens(); ++t) {
    const int64_t row = static_cast<int64_t>(batch.token_ids[t]) - first_row;
    if (row < 0 || row >= table.rows) std::fill(o + t * H, o + (t + 1) * H, 0.0f);
    else std::copy(tab + row * H, tab + (row + 1) * H, o + t * H);
  }
}

void CpuOps::rmsnorm(const Tensor& x, const Tensor& w, float eps, Tensor y) {
  check_same_shape(x, y, "rmsnorm");
  MR_CHECK(w.numel() == x.cols) << "rmsnorm weight";
  cpu::rmsnorm(f32(x), static_cast<int>(x.rows), static_cast<int>(x.cols), f32(w), eps, f32(y));
}

void CpuOps::linear(const Tensor& x, const Matrix& w, Tensor y) {
  MR_CHECK(w.kind() == WeightFormat::dense) << "dense linear over a quantized (MXFP4 / INT4) matrix";
  MR_CHECK(x.cols == w.in && y.cols == w.out && x.rows == y.rows)
      << "linear: x [" << x.rows << ", " << x.cols << "] W [" << w.out << ", " << w.in << "] y [" << y.rows << ", "
      << y.cols << "]";
  matmul_xwT(f32(x), static_cast<int>(x.rows), w.in, f32(w.w), w.out, f32(y));
}

void CpuOps::add(const Tensor& a, const Tensor& b, Tensor y) {
  check_same_shape(a, b, "add");
  check_same_shape(a, y, "add");
  const float* pa = f32(a);
  const float* pb = f32(b);
  float* py = f32(y);
  for (int64_t i = 0; i < a.numel(); ++i) py[i] = pa[i] + pb[i];
}

void CpuOps::mul(const Tensor& a, const Tensor& b, Tensor y) {
  check_same_shape(a, b, "mul");
  check_same_shape(a, y, "mul");
  const float* pa = f32(a);
  const float* pb = f32(b);
  float* py = f32(y);
  for (int64_t i = 0; i < a.numel(); ++i) py[i] = pa[i] * pb[i];
}

void CpuOps::gated_activation(const Tensor& gate, const Tensor& up, const ActivationParams& act, Tensor y) {
  check_same_shape(gate, up, "gated_activation");
  check_same_shape(gate, y, "gated_activation");
  cpu::gated_activation(f32(gate), f32(up), gate.numel(), act, f32(y));
}

void CpuOps::attn_res_mix(const Tensor& prefix, const Tensor& blocks, int n_blocks, const Tensor& w_norm,
                          const Tensor& w_proj, float eps, Tensor out) {
  check_same_shape(prefix, out, "attn_res_mix");
  const int64_t T = prefix.rows, H = prefix.cols;
  std::vector<const float*> ptrs(n_blocks);
  for (int i = 0; i < n_blocks; ++i) ptrs[i] = f32(blocks) + i * T * H;
  cpu::attn_res_mix(f32(prefix), ptrs.data(), n_blocks, static_cast<int>(T), static_cast<int>(H), f32(w_norm),
                    f32(w_proj), eps, f32(out));
}

void CpuOps::gelu(const Tensor& x, bool tanh_approx, Tensor y) {
  check_same_shape(x, y, "gelu");
  cpu::gelu(f32(x), x.numel(), tanh_approx, f32(y));
}

void CpuOps::vision_attention(const Tensor& qkv, const Tensor& rope, std::span<const int32_t> seq_starts,
                              int num_heads, int head_dim, Tensor out) {
  const int64_t width = static_cast<int64_t>(num_heads) * head_dim;
  MR_CHECK(qkv.cols == 3 * width && out.cols == width && rope.cols == head_dim && head_dim % 2 == 0)
      << "vision_attention: qkv [" << qkv.rows << ", " << qkv.cols << "], rope [" << rope.rows << ", " << rope.cols
      << "], out [" << out.rows << ", " << out.cols << "] for " << num_heads << " heads of " << head_dim;
  MR_CHECK(qkv.rows == out.rows && rope.rows == qkv.rows && !seq_starts.empty() && seq_starts.front() == 0 &&
           seq_starts.back() == qkv.rows)
      << "vision_attention: images must cover the " << qkv.rows << " rows";
  cpu::vision_attention(f32(qkv), f32(rope), seq_starts, num_heads, head_dim, f32(out));
}

void CpuOps::gather_rows(const Tensor& x, const int32_t* rows, Tensor y) {
  MR_CHECK(x.cols == y.cols && x.dtype == y.dtype) << "gather_rows";
  const size_t row_bytes = static_cast<size_t>(x.cols) * dtype_size_bytes(x.dtype);
  for (int64_t i = 0; i < y.rows; ++i) {
    MR_CHECK(rows[i] >= 0 && rows[i] < x.rows) << "gather row " << rows[i] << " of " << x.rows;
    std::memcpy(static_cast<char*>(y.data) + i * row_bytes, static_cast<const char*>(x.data) + rows[i] * row_bytes,
                row_bytes);
  }
}

// ---- KDA -----------------------------------------------------------------------------

void CpuOps::short_conv(const Tensor& x, const Tensor& weight, const BatchView& batch, StateLayer window, bool silu,
                        Tensor y) {
  check_same_shape(x, y, "short_conv");
  const int D = static_cast<int>(x.cols), K = static_cast<int>(weight.cols);
  for (int s = 0; s < batch.n_seqs(); ++s) {
    const BatchSeq& seq = batch.seqs[s];
    const int64_t off = static_cast<int64_t>(seq.token_start) * D;
    cpu::short_conv(f32(x) + off, seq.n_new, D, f32(weight), K, window.slot(seq.state_slot), silu, f32(y) + off);
  }
}

void CpuOps::l2norm_rows(Tensor x, float scale) { cpu::l2norm_rows(f32(x), x.rows, static_cast<int>(x.cols), scale); }

void CpuOps::kda_gate(Tensor g, const Tensor& A_log, const Tensor& dt_bias, int head_dim, float lower_bound) {
  const int H = static_cast<int>(g.cols / head_dim);
  MR_CHECK(A_log.numel() == H && dt_bias.numel() == g.cols) << "kda_gate parameters";
  cpu::kda_gate(f32(g), static_cast<int>(g.rows), H, head_dim, f32(A_log), f32(dt_bias), lower_bound);
}

void CpuOps::sigmoid(Tensor x) {
  float* p = f32(x);
  for (int64_t i = 0; i < x.numel(); ++i) p[i] = cpu::sigmoid(p[i]);
}

void CpuOps::rope_interleaved(Tensor x, const Tensor& cos_sin, int n_heads, int head_width, int rope_offset) {
  const int rope_dim = static_cast<int>(cos_sin.cols), half = rope_dim / 2;
  MR_CHECK(cos_sin.rows == x.rows && x.cols == static_cast<int64_t>(n_heads) * head_width &&
           rope_offset + rope_dim <= head_width && rope_dim % 2 == 0)
      << "rope_interleaved: x [" << x.rows << ", " << x.cols << "], cos_sin [" << cos_sin.rows << ", " << rope_dim << "]";
  float* base = f32(x);
  const float* cs = cos_sin.as<float>();
  for (int64_t t = 0; t < x.rows; ++t) {
    const float* c = cs + t * rope_dim;
    for (int h = 0; h < n_heads; ++h) {
      float* p = base + t * x.cols + static_cast<int64_t>(h) * head_width + rope_offset;
      for (int i = 0; i < half; ++i) {
        const float x0 = p[2 * i], x1 = p[2 * i + 1];
        p[2 * i] = x0 * c[i] - x1 * c[half + i];
        p[2 * i + 1] = x0 * c[half + i] + x1 * c[i];
      }
    }
  }
}

void CpuOps::kda_recurrence(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta,
                            const BatchView& batch, StateLayer state, int num_heads, int head_dim, KdaMode mode,
                            Tensor o) {
  const int64_t D = static_cast<int64_t>(num_heads) * head_dim;
  MR_CHECK(q.cols == D && beta.cols == num_heads) << "kda_recurrence shapes";
  for (int s = 0; s < batch.n_seqs(); ++s) {
    const BatchSeq& seq = batch.seqs[s];
    const int64_t off = seq.token_start * D;
    const float* b = f32(beta) + static_cast<int64_t>(seq.token_start) * num_heads;
    float* S = state.slot(seq.state_slot);
    const bool recurrent = mode == KdaMode::kRecurrent || (mode == KdaMode::kAuto && seq.n_new == 1);
    if (recurrent)
      kda_recurrent(f32(q) + off, f32(k) + off, f32(v) + off, f32(g) + off, b, seq.n_new, num_heads, head_dim, S,
                    f32(o) + off);
    else
      kda_chunked(f32(q) + off, f32(k) + off, f32(v) + off, f32(g) + off, b, seq.n_new, num_heads, head_dim, S,
                  f32(o) + off);
  }
}

void CpuOps::gated_rmsnorm(const Tensor& o, const Tensor& gate, const Tensor& w, float eps, Tensor y) {
  check_same_shape(o, gate, "gated_rmsnorm");
  check_same_shape(o, y, "gated_rmsnorm");
  cpu::gated_rmsnorm(f32(o), f32(gate), f32(w), o.rows, static_cast<int>(o.cols), eps, f32(y));
}

// ---- MLA -----------------------------------------------------------------------------

namespace {

// Where position `pos` of a sequence sits in the paged cache: its row's first element.
int64_t cache_row_index(const KvLayer& cache, const BatchView& batch, const BatchSeq& seq, int pos) {
  const int page = batch.page_table[seq.page_start + pos / cache.page_size_tokens];
  return (static_cast<int64_t>(page) * cache.page_size_tokens + pos % cache.page_size_tokens) * cache.row_width;
}

// The CPU keeps the cache in F32, or in fp8 e4m3 (--kv-cache-dtype fp8_e4m3: each value
// rounded to nearest even and saturated at +-448, scale 1, as vLLM's fp8 cache without
// calibrated scales), which it widens back to F32 to attend.
void check_cache_dtype(const KvLayer& cache) {
  MR_CHECK(cache.dtype == DType::F32 || cache.dtype == DType::F8_E4M3) << "the CPU KV cache is F32 or F8_E4M3";
}

}  // namespace

void CpuOps::mla_store(const Tensor& ckv, const Tensor& norm_w, float eps, const BatchView& batch, KvLayer cache) {
  const int L = static_cast<int>(norm_w.numel()), R = static_cast<int>(ckv.cols) - L;
  MR_CHECK(R >= 0 && cache.row_width == L + R) << "mla_store row width";
  check_cache_dtype(cache);
  std::vector<float> row(static_cast<size_t>(L + R));
  for (int t = 0; t < batch.n_tokens(); ++t) {
    const BatchSeq& seq = batch.seqs[batch.token_seq[t]];
    const float* src = f32(ckv) + static_cast<int64_t>(t) * (L + R);
    cpu::rmsnorm(src, 1, L, f32(norm_w), eps, row.data());
    std::copy(src + L, src + L + R, row.data() + L);
    const int64_t at = cache_row_index(cache, batch, seq, batch.positions[t]);
    if (cache.dtype == DType::F32) {
      std::copy(row.begin(), row.end(), static_cast<float*>(cache.base) + at);
    } else {
      uint8_t* dst = static_cast<uint8_t*>(cache.base) + at;
      for (int i = 0; i < L + R; ++i) dst[i] = f32_to_f8e4m3(row[i]);
    }
  }
}

namespace {

// A sequence's cache rows [0, n_positions) as F32 row pointers; an fp8 cache's rows are
// widened into `widened`, which must outlive the pointers.
void cache_rows_f32(const KvLayer& cache, const BatchView& batch, const BatchSeq& seq, int n_positions,
                 std::vector<const float*>& rows, std::vector<float>& widened) {
  const int W = cache.row_width;
  rows.resize(n_positions);
  if (cache.dtype == DType::F8_E4M3) widened.resize(static_cast<size_t>(n_positions) * W);
  for (int p = 0; p < n_positions; ++p) {
    const int64_t at = cache_row_index(cache, batch, seq, p);
    if (cache.dtype == DType::F32) {
      rows[p] = static_cast<const float*>(cache.base) + at;
      continue;
    }
    const uint8_t* src = static_cast<const uint8_t*>(cache.base) + at;
    float* dst = widened.data() + static_cast<size_t>(p) * W;
    for (int i = 0; i < W; ++i) dst[i] = f8e4m3_to_f32(src[i]);
    rows[p] = dst;
  }
}

// A sequence's FP8 indexer keys [0, n_positions) dequantised (backend/dsa_index_row.h) into
// `widened`, as F32 row pointers.
void index_rows_f32(const KvLayer& cache, const BatchView& batch, const BatchSeq& seq, int n_positions, int head_dim,
                    std::vector<const float*>& rows, std::vector<float>& widened) {
  rows.resize(n_positions);
  widened.resize(static_cast<size_t>(n_positions) * head_dim);
  for (int p = 0; p < n_positions; ++p) {
    const uint8_t* src = static_cast<const uint8_t*>(cache.base) + cache_row_index(cache, batch, seq, p);
    float* dst = widened.data() + static_cast<size_t>(p) * head_dim;
    dsa_dequantize_index_row(src, head_dim, dst);
    rows[p] = dst;
  }
}

// Dense MLA (selected null) and sparse MLA (DSA: indices [T, k] I32) share this loop and the
// kernels under it, so the two cannot drift apart.
void attend_mla(const Tensor& q, const Matrix& kv_b, const BatchView& batch, KvLayer cache, const MlaShape& shape,
                MlaMode mode, const Tensor* selected, Tensor o) {
  const int H = shape.num_heads;
  const int64_t q_width = static_cast<int64_t>(H) * (shape.nope + shape.rope), o_width = static_cast<int64_t>(H) * shape.v_dim;
  MR_CHECK(q.cols == q_width && o.cols == o_width) << "mla_attention shapes";
  MR_CHECK(kv_b.out == H * (shape.nope + shape.v_dim) && kv_b.in == shape.kv_lora) << "kv_b shape";
  check_cache_dtype(cache);
  const int k = selected ? static_cast<int>(selected->cols) : 0;
  if (selected) {
    MR_CHECK(selected->dtype == DType::I32 && selected->rows == q.rows && k > 0) << "mla_sparse_attention indices shape";
    // The kernels trust the lists: a position outside the causal range would read a future
    // key or another sequence's row, and a repeated one would count its key twice.
    std::vector<char> listed;
    for (int t = 0; t < batch.n_tokens(); ++t) {
      const int32_t* sel = selected->as<int32_t>() + static_cast<int64_t>(t) * k;
      bool padding = false;
      listed.assign(batch.positions[t] + 1, 0);
      for (int j = 0; j < k; ++j) {
        MR_CHECK(sel[j] <= batch.positions[t] && (sel[j] >= 0 || sel[j] == -1) && !(padding && sel[j] >= 0) &&
                 (sel[j] < 0 || !listed[sel[j]]))
            << "mla_sparse_attention: token " << t << " at position " << batch.positions[t] << " lists " << sel[j]
            << " (entries must be distinct positions in the causal range [0, position], then -1s)";
        padding = sel[j] < 0;
        if (!padding) listed[sel[j]] = 1;
      }
      MR_CHECK(sel[0] >= 0) << "mla_sparse_attention: token " << t << " selects no key";
    }
  }
  std::vector<const float*> rows;
  std::vector<float> widened;  // an fp8 cache's rows of one sequence, as F32
  for (int s = 0; s < batch.n_seqs(); ++s) {
    const BatchSeq& seq = batch.seqs[s];
    cache_rows_f32(cache, batch, seq, seq.n_past + seq.n_new, rows, widened);
    const float* qs = f32(q) + seq.token_start * q_width;
    float* os = f32(o) + seq.token_start * o_width;
    const int32_t* sel = selected ? selected->as<int32_t>() + static_cast<int64_t>(seq.token_start) * k : nullptr;
    const bool absorbed = mode == MlaMode::kAbsorbed || (mode == MlaMode::kAuto && seq.n_new == 1);
    // A decode token over a long context: its keys split over the threads (mla.h).
    const int splits = !sel && seq.n_new == 1 ? mla_cpu_kv_splits(seq.n_past + 1) : 1;
    if (absorbed) mla_attend_absorbed(qs, f32(kv_b.w), shape, seq.n_new, seq.n_past, rows.data(), os, sel, k, splits);
    else mla_attend_plain(qs, f32(kv_b.w), shape, seq.n_new, seq.n_past, rows.data(), os, sel, k);
  }
}

}  // namespace

void CpuOps::mla_attention(const Tensor& q, const Matrix& kv_b, const BatchView& batch, KvLayer cache,
                           const MlaShape& shape, MlaMode mode, Tensor o) {
  attend_mla(q, kv_b, batch, cache, shape, mode, nullptr, o);
}

// ---- DSA (the indexer's math is in cpu/dsa.h) ------------------------------------------

void CpuOps::mla_sparse_attention(const Tensor& q, const Matrix& kv_b, const BatchView& batch, KvLayer cache,
                                  const MlaShape& shape, MlaMode mode, const Tensor& indices, Tensor o) {
  attend_mla(q, kv_b, batch, cache, shape, mode, &indices, o);
}

// The indexer-key pool is F32 on the CPU. The reference caches the keys in fp8 with a scale
// per 128 values; that layout comes with the CUDA indexer (issue 38, item 3).
void CpuOps::dsa_index_store(const Tensor& k, const Tensor& norm_w, const Tensor& norm_b, float eps,
                             const BatchView& batch, KvLayer cache) {
  const int D = static_cast<int>(k.cols);
  const bool fp8 = cache.dtype == DType::F8_E4M3;
  MR_CHECK((cache.dtype == DType::F32 && cache.row_width == D) || (fp8 && cache.row_width == dsa_fp8_row_width(D)))
      << "dsa_index_store: an F32 pool of rows of " << D << " or an FP8 one of " << dsa_fp8_row_width(D);
  MR_CHECK(norm_w.numel() == D && norm_b.numel() == D && k.rows == batch.n_tokens()) << "dsa_index_store shapes";
  std::vector<float> key(fp8 ? D : 0);
  for (int t = 0; t < batch.n_tokens(); ++t) {
    const BatchSeq& seq = batch.seqs[batch.token_seq[t]];
    const int64_t at = cache_row_index(cache, batch, seq, batch.positions[t]);
    const float* x = f32(k) + static_cast<int64_t>(t) * D;
    if (!fp8) {
      layernorm_row(x, D, f32(norm_w), f32(norm_b), eps, static_cast<float*>(cache.base) + at);
      continue;
    }
    layernorm_row(x, D, f32(norm_w), f32(norm_b), eps, key.data());
    dsa_quantize_index_row(key.data(), D, static_cast<uint8_t*>(cache.base) + at);
  }
}

void CpuOps::dsa_index_scores(const Tensor& q, const Tensor& weights, const BatchView& batch, KvLayer cache,
                              const DsaIndexerShape& shape, Tensor scores, int first_token) {
  const int H = shape.num_heads, D = shape.head_dim;
  const int first = first_token, last = first_token + static_cast<int>(q.rows);  // the block's batch rows
  MR_CHECK(q.cols == static_cast<int64_t>(H) * D && weights.cols == H && first >= 0 && last <= batch.n_tokens() &&
           weights.rows == q.rows && scores.rows == q.rows)
      << "dsa_index_scores shapes";
  const bool fp8 = cache.dtype == DType::F8_E4M3;
  MR_CHECK((cache.dtype == DType::F32 && cache.row_width == D) || (fp8 && cache.row_width == dsa_fp8_row_width(D)))
      << "dsa_index_scores: an F32 pool of rows of " << D << " or an FP8 one of " << dsa_fp8_row_width(D);
  std::vector<const float*> rows;
  std::vector<float> widened;
  for (int s = 0; s < batch.n_seqs(); ++s) {
    const BatchSeq& seq = batch.seqs[s];
    // The part of the sequence's new tokens inside the block.
    const int t0 = std::max(seq.token_start, first), t1 = std::min(seq.token_start + seq.n_new, last);
    if (t0 >= t1) continue;
    const int n_past = seq.n_past + (t0 - seq.token_start);
    if (fp8) index_rows_f32(cache, batch, seq, n_past + (t1 - t0), D, rows, widened);
    else cache_rows_f32(cache, batch, seq, n_past + (t1 - t0), rows, widened);
    cpu::dsa_index_scores(f32(q) + static_cast<int64_t>(t0 - first) * H * D,
                          f32(weights) + static_cast<int64_t>(t0 - first) * H, shape, t1 - t0, n_past, rows.data(),
                          f32(scores) + (t0 - first) * scores.cols, scores.cols, static_cast<int>(scores.cols));
  }
}

void CpuOps::dsa_topk(const Tensor& scores, const BatchView& batch, Tensor indices, int first_token) {
  MR_CHECK(indices.dtype == DType::I32 && first_token >= 0 && first_token + indices.rows <= batch.n_tokens() &&
           scores.rows == indices.rows && indices.cols > 0)
      << "dsa_topk shapes";
  const int k = static_cast<int>(indices.cols);
  for (int r = 0; r < indices.rows; ++r) {
    const int t = first_token + r;
    const int visible = batch.positions[t] + 1;
    MR_CHECK(visible <= scores.cols) << "dsa_topk: position " << batch.positions[t] << " past the scores' columns";
    dsa_topk_row(f32(scores) + r * scores.cols, visible, k, indices.as<int32_t>() + static_cast<int64_t>(r) * k);
  }
}

// ---- MoE -----------------------------------------------------------------------------

void CpuOps::router_topk(const Tensor& logits, const Tensor& bias, const RouterParams& p, Tensor ids, Tensor weights) {
  const int E = p.num_experts, K = p.top_k;
  MR_CHECK(logits.cols == E && ids.cols == K && weights.cols == K && ids.dtype == DType::I32) << "router_topk shapes";
  for (int64_t t = 0; t < logits.rows; ++t)
    route_token(f32(logits) + t * E, bias.empty() ? nullptr : f32(bias), p, ids.as<int32_t>() + t * K,
                f32(weights) + t * K);
}

void CpuOps::moe_experts(const Tensor& x, const Tensor& ids, const Tensor& weights, const ExpertMatrices& w1,
                         const ExpertMatrices& w3, const ExpertMatrices& w2, const ActivationParams& act, Tensor y) {
  const int in = static_cast<int>(x.cols), inter = w1.stacked.out, E = w1.num_experts;
  MR_CHECK(w1.stacked.in == in && w2.stacked.out == in && w2.stacked.in == inter) << "moe_experts shapes";
  // Per expert e: rows [e * out, (e + 1) * out) of each stacked matrix, as F32 (MXFP4 and
  // INT4 dequantised here, one expert at a time: the reference favours clarity over speed).
  std::vector<float> gate, up, down;
  auto expert_rows = [](const ExpertMatrices& m, int e, std::vector<float>& buf) -> const float* {
    const Matrix& s = m.stacked;
    const int64_t first = static_cast<int64_t>(e) * s.out;
    if (s.kind() == WeightFormat::dense) return f32(s.w) + first * s.in;
    buf.resize(static_cast<size_t>(s.out) * s.in);
    if (s.int4()) {
      dequantize_int4_g32(s.w.as<uint32_t>() + first * (s.in / 8), s.scales.as<uint16_t>() + first * (s.in / 32),
                          s.out, s.in, buf.data());
      return buf.data();
    }
    dequantize_mxfp4(s.w.as<uint8_t>() + first * (s.in / 2), s.scales.as<uint8_t>() + first * (s.in / 32), s.out,
                     s.in, buf.data());
    return buf.data();
  };
  auto expert = [&](int e) {
    ExpertF32 f;
    f.gate = expert_rows(w1, e, gate);
    f.up = expert_rows(w3, e, up);
    f.down = expert_rows(w2, e, down);
    f.inter = inter;
    return f;
  };
  cpu::moe_experts(f32(x), static_cast<int>(x.rows), in, ids.as<int32_t>(), f32(weights), static_cast<int>(ids.cols),
                   w1.first_expert, E, expert, act, f32(y));
}

// ---- collectives ---------------------------------------------------------------------

void CpuOps::all_reduce_sum(Tensor x) {
  MR_CHECK(x.dtype == DType::F32) << "all_reduce_sum takes F32";
  if (comm_ && comm_->size() > 1) comm_->all_reduce_sum(f32(x), static_cast<size_t>(x.numel()));
}

void CpuOps::all_gather_cols(const Tensor& x, Tensor out) {
  const Tensor parts[] = {x};
  Tensor outs[] = {out};
  all_gather_cols_packed(parts, outs);
}

void CpuOps::all_gather_cols_packed(std::span<const Tensor> parts, std::span<Tensor> outs) {
  const int W = parallel_size();
  MR_CHECK(parts.size() == outs.size() && !parts.empty()) << parts.size() << " parts for " << outs.size() << " outputs";
  size_t n = 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    const Tensor &x = parts[i], &out = outs[i];
    MR_CHECK(x.dtype == DType::F32 && out.dtype == DType::F32 && out.rows == x.rows && out.cols == W * x.cols)
        << "all_gather_cols_packed part " << i << ": [" << x.rows << ", " << x.cols << "] x " << W << " -> ["
        << out.rows << ", " << out.cols << "]";
    MR_CHECK(f32(x) == f32(parts[0]) + n) << "all_gather_cols_packed: part " << i << " does not follow part " << i - 1;
    n += static_cast<size_t>(x.numel());
  }
  if (W == 1) {
    for (size_t i = 0; i < parts.size(); ++i) copy(parts[i], outs[i]);
    return;
  }
  // Gathered rank-major ([W, n]); each rank's block holds its parts one after another.
  gather_buf_.resize(n * W);
  comm_->all_gather(f32(parts[0]), n, gather_buf_.data());
  for (int r = 0; r < W; ++r) {
    const float* block = gather_buf_.data() + r * n;
    for (size_t i = 0; i < parts.size(); ++i) {
      const Tensor &x = parts[i], &out = outs[i];
      float* o = f32(out);
      for (int64_t row = 0; row < x.rows; ++row)
        std::copy_n(block + row * x.cols, x.cols, o + row * out.cols + r * x.cols);
      block += x.numel();
    }
  }
}

void CpuOps::pipe_send(const Tensor& x) {
  MR_CHECK(x.dtype == DType::F32) << "pipe_send takes F32";
  if (!pipe_next_) throw BackendError("pipe_send: this rank has no next stage");
  // The sender is the root of its pair (either rank: the runtime puts a pair's hub on the
  // lower process); its buffer is only read.
  pipe_next_->broadcast(const_cast<float*>(x.as<float>()), static_cast<size_t>(x.numel()), pipe_next_->rank());
}

void CpuOps::pipe_recv(Tensor x) {
  MR_CHECK(x.dtype == DType::F32) << "pipe_recv takes F32";
  if (!pipe_prev_) throw BackendError("pipe_recv: this rank has no previous stage");
  pipe_prev_->broadcast(f32(x), static_cast<size_t>(x.numel()), 1 - pipe_prev_->rank());
}

// ---- sampling ------------------------------------------------------------------------

void CpuOps::dspark_markov(Tensor logits, const Tensor& w1, const Tensor& w2, const int32_t* ids, int block,
                           int n_slots, const Tensor& h, const Tensor& conf_w, float conf_b, Tensor tokens, Tensor conf) {
  const int64_t V = logits.cols, r = w1.cols, H = h.cols;
  MR_CHECK(block > 0 && logits.rows % block == 0 && n_slots >= 0 && n_slots <= block && w1.rows == V &&
           w2.rows == V && w2.cols == r && tokens.rows == logits.rows)
      << "dspark_markov: logits [" << logits.rows << ", " << V << "], w1 [" << w1.rows << ", " << r << "], block "
      << block << ", slots " << n_slots;
  const bool with_conf = !conf_w.empty();
  const bool conf_markov = with_conf && conf_w.cols == H + r;
  MR_CHECK(!with_conf || ((conf_w.cols == H || conf_markov) && h.rows == logits.rows && conf.rows == logits.rows))
      << "dspark_markov: confidence weights [" << conf_w.rows << ", " << conf_w.cols << "], h [" << h.rows << ", " << H
      << "]";
  const float *W1 = f32(w1), *W2 = f32(w2);
  float* L = f32(logits);
  int32_t* out = tokens.as<int32_t>();
  for (int64_t b = 0; b < logits.rows / block; ++b) {
    int32_t prev = ids[b * block];
    for (int k = 0; k < n_slots; ++k) {
      const int64_t row_id = b * block + k;
      const float* e = W1 + static_cast<int64_t>(prev) * r;
      float* row = L + row_id * V;
      int32_t best = 0;
      for (int64_t v = 0; v < V; ++v) {
        const float* w = W2 + v * r;
        float dot = 0.0f;
        for (int64_t c = 0; c < r; ++c) dot += w[c] * e[c];
        row[v] += dot;
        if (row[v] > row[best]) best = static_cast<int32_t>(v);
      }
      if (with_conf) {
        const float* cw = f32(conf_w);
        const float* hk = f32(h) + row_id * H;
        double z = conf_b;
        for (int64_t c = 0; c < H; ++c) z += cw[c] * hk[c];
        if (conf_markov)
          for (int64_t c = 0; c < r; ++c) z += cw[H + c] * e[c];
        f32(conf)[row_id] = static_cast<float>(1.0 / (1.0 + std::exp(-z)));
      }
      out[row_id] = best;
      prev = best;
    }
  }
}

void CpuOps::sample(const Tensor& logits, const SamplingBatch& rows, std::vector<SampleResult>& out) {
  MR_CHECK(logits.rows == static_cast<int64_t>(rows.rows.size())) << "one sampling rule per logits row";
  out.resize(rows.rows.size());
  for (size_t r = 0; r < rows.rows.size(); ++r)
    out[r] = sample_row(f32(logits) + r * logits.cols, static_cast<int>(logits.cols), rows.rows[r], rows);
}

}  // namespace moonrun::cpu
