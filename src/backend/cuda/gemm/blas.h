#pragma once
// Dense projections on the GPU through cuBLASLt, and at decode sizes through the skinny
// tensor-core kernel (skinny_gemm.h): bf16 inputs and weights, fp32 accumulation (K3_SPEC.md
// §2: bf16 storage, fp32 math). The CPU twin is cpu::matmul_xwT.
#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <map>
#include <tuple>

#include "backend/cuda/common/bf16.h"

namespace moonrun::cuda {

// nn.Linear convention on the device: w row-major [out_features, in_features], bf16.
struct DeviceLinear {
  const bf16* w = nullptr;
  int out_features = 0;
  int in_features = 0;
  bool empty() const { return w == nullptr; }
};

// One cuBLASLt handle and workspace per stream. Every matmul runs with CUBLAS_COMPUTE_32F
// (no TF32) and only split-K reductions in fp32 (never in the bf16 output type), so the
// result is the fp32 dot product up to summation order. n_tokens = 0 is a no-op.
class Blas {
 public:
  explicit Blas(cudaStream_t stream);
  ~Blas();
  Blas(const Blas&) = delete;
  Blas& operator=(const Blas&) = delete;
  cudaStream_t stream() const { return stream_; }

  // y[t, o] = sum_i x[t, i] * w[o, i]; x [n_tokens, in] bf16, y [n_tokens, out].
  void linear(const bf16* x, int n_tokens, const DeviceLinear& w, float* y);
  void linear(const bf16* x, int n_tokens, const DeviceLinear& w, bf16* y);
  // `batch` matrices of w's shape back to back (w.w, w.w + out * in, ...) over the same x, in
  // one strided-batched call: y_b = y + b * n_tokens * out. Several decode-size projections
  // of one input stream as one GEMM instead of one tail each.
  void linear_batched(const bf16* x, int n_tokens, const DeviceLinear& w, int batch, float* y);
  void linear_batched(const bf16* x, int n_tokens, const DeviceLinear& w, int batch, bf16* y);
  // All fp32, TF32 off: the router's logits ("router logits in fp32 from the full-width x").
  // x [n_tokens, in], w [out, in] row-major fp32, y [n_tokens, out].
  void linear_f32(const float* x, int n_tokens, const float* w, int out_features, int in_features, float* y);

  // Decode sizes take the skinny tensor-core kernel (skinny_gemm.h) unless this is off (the
  // tests and benchmarks set it to compare with cuBLASLt on the same shapes).
  void set_skinny(bool on) { skinny_enabled_ = on; }

  // Workspace for split-K and stream-K algorithms.
  static constexpr size_t kWorkspaceBytes = size_t{32} << 20;

 private:
  // One matmul shape: descriptors and the heuristic's algorithm, built once and reused
  // (the heuristic query costs more than a decode-size matmul).
  struct Plan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo{};
  };
  // (in/out data types, m, n, k, alignment of the pointers in bytes, batch)
  using PlanKey = std::tuple<int, int, int, int, int, int, int, int, int>;
  const Plan& plan(cudaDataType_t ab_type, cudaDataType_t cd_type, int out_features, int n_tokens,
                   int in_features, const void* w, const void* x, const void* y, int batch);
  void matmul(cudaDataType_t ab_type, cudaDataType_t cd_type, const void* x, int n_tokens, const void* w,
              int out_features, int in_features, void* y, int batch = 1);

  template <typename Out>
  bool skinny(const bf16* x, int n_tokens, const DeviceLinear& w, int batch, Out* y);

  std::map<PlanKey, Plan> plans_;
  bool skinny_enabled_ = true;
  cudaStream_t stream_;
  cublasLtHandle_t lt_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
};

}  // namespace moonrun::cuda
