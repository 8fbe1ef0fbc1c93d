#pragma once
// What the ops of a backend (backend/ops.h) take and return: plain views of the backend's
// memory (host memory on the CPU backend, device memory on CUDA). A view does not own what
// it points at: weights belong to the model's backend allocation, activations to the step
// scratch, caches to the runner's pools.
//
// Every activation is 2-D, [rows, cols] row-major with contiguous rows: rows are tokens
// (or token x head rows, as a view), cols the feature width.
#include <cstddef>
#include <cstdint>

#include "common/check.h"
#include "common/dtype.h"

namespace moonrun {

struct Tensor {
  void* data = nullptr;
  DType dtype = DType::F32;
  int64_t rows = 0;
  int64_t cols = 0;

  bool empty() const { return data == nullptr; }
  int64_t numel() const { return rows * cols; }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size_bytes(dtype); }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data);
  }
  // Rows [first, first + n).
  Tensor rows_view(int64_t first, int64_t n) const {
    MR_CHECK(first >= 0 && n >= 0 && first + n <= rows) << "rows [" << first << ", " << first + n << ") of " << rows;
    return Tensor{static_cast<char*>(data) + static_cast<size_t>(first * cols) * dtype_size_bytes(dtype), dtype, n,
                  cols};
  }
  // The same memory seen as [numel / cols, cols] (e.g. [T, H*d] as [T*H, d] head rows).
  Tensor reshaped(int64_t new_cols) const {
    MR_CHECK(new_cols > 0 && numel() % new_cols == 0) << numel() << " elements as rows of " << new_cols;
    return Tensor{data, dtype, numel() / new_cols, new_cols};
  }
};

// How a Matrix's bytes encode its weights; each backend dispatches its expert GEMM on it.
enum class WeightFormat : uint8_t {
  dense,         // w is BF16 or F32 [out, in]
  mxfp4_g32,     // K3_SPEC.md §3: w = E2M1 codes U8 [out, in/2], scales = E8M0 U8 [out, in/32]
  int4_g32_sym,  // compressed-tensors pack-quantized (cpu/int4.h): w = I32 [out, in/8] words of
                 // eight u4 = q + 8, scales = BF16 [out, in/32]; weight = q * scale
};

// A projection weight [out, in] in nn.Linear convention (y = x W^T) in one of the formats
// above.
struct Matrix {
  Tensor w;
  Tensor scales;  // quantized formats only
  int out = 0;
  int in = 0;
  // Set by whoever fills a quantized matrix; a dense tag with scales present still means
  // MXFP4 (the convention before the tag, kept for the tests and benches that build them).
  WeightFormat format = WeightFormat::dense;
  // Set by a backend's Ops::repack_experts when it re-laid the words into a layout of its own
  // that only it reads (CUDA's INT4 under MOONRUN_INT4_FAST=1); the CPU never sets it. MXFP4's
  // CUDA re-layout is unconditional and leaves it unset.
  bool backend_layout = false;
  bool empty() const { return w.empty(); }
  WeightFormat kind() const {
    if (format != WeightFormat::dense) return format;
    return scales.empty() ? WeightFormat::dense : WeightFormat::mxfp4_g32;
  }
  bool mxfp4() const { return kind() == WeightFormat::mxfp4_g32; }
  bool int4() const { return kind() == WeightFormat::int4_g32_sym; }
};

// The routed experts of one layer, one Matrix per kind stacked over experts: expert e's
// rows are [e * out, (e + 1) * out) of `stacked` (and of its scales), so the grouped GEMM
// indexes them without a descriptor per expert.
struct ExpertMatrices {
  Matrix stacked;        // [num_experts * out, in]
  int num_experts = 0;   // held here (this rank's, under expert parallelism)
  int first_expert = 0;  // the global id of stacked expert 0
  bool empty() const { return stacked.empty(); }
};

// Per-slot recurrent state of one layer: slot s's region starts at
// base + s * slot_stride_floats (F32), laid out as the op that owns it describes.
struct StateLayer {
  float* base = nullptr;
  int64_t slot_stride_floats = 0;
  float* slot(int s) const { return base + static_cast<int64_t>(s) * slot_stride_floats; }
};

// One layer of the paged KV pool: the row of page p, offset t is at
// base + (p * page_size_tokens + t) * row_width elements of `dtype`.
struct KvLayer {
  void* base = nullptr;
  DType dtype = DType::F32;
  int page_size_tokens = 0;
  int row_width = 0;
};

}  // namespace moonrun
