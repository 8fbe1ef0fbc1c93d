// Dense projections through cuBLASLt; the CPU twin is cpu::matmul_xwT (backend/cpu/linear.h).
//
// Layout. The model keeps everything row-major, cuBLASLt thinks column-major. A row-major
// [r, c] matrix is the column-major [c, r] one with the same bytes, so
//   y[T, out] = x[T, in] W[out, in]^T          (row-major, nn.Linear)
// is, column-major,
//   Y[out, T] = W'[in, out]^T X'[in, T]        (W' = W's bytes, X' = x's bytes)
// i.e. one "TN" matmul with m = out, n = T, k = in, lda = ldb = in, ldc = out: the layout
// cuBLASLt's bf16 kernels are best at, and no transposed copy of anything.
//
// Precision. CUBLAS_COMPUTE_32F (not _FAST_TF32): bf16 x bf16 products are exact in fp32 and
// are summed in fp32; fp32 inputs stay fp32 (no TF32 rounding of the router's inputs). Split-K
// partial sums may only be reduced in the compute type (CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE),
// never in the output type, so a bf16 output is rounded once, at the end.
#include "backend/cuda/gemm/blas.h"

#include <algorithm>
#include <string>
#include <vector>

#include "backend/cuda/common/cuda_check.h"
#include "backend/cuda/gemm/skinny_gemm.h"

namespace moonrun::cuda {

Blas::Blas(cudaStream_t stream) : stream_(stream) {
  CUBLAS_CHECK(cublasLtCreate(&lt_));
  workspace_bytes_ = kWorkspaceBytes;
  CUDA_CHECK(cudaMalloc(&workspace_, workspace_bytes_));
}

Blas::~Blas() {
  // No throwing from a destructor: failures here only leak.
  for (auto& [key, p] : plans_) {
    cublasLtMatrixLayoutDestroy(p.a);
    cublasLtMatrixLayoutDestroy(p.b);
    cublasLtMatrixLayoutDestroy(p.c);
    cublasLtMatmulDescDestroy(p.desc);
  }
  if (workspace_) cudaFree(workspace_);
  if (lt_) cublasLtDestroy(lt_);
}

namespace {

// The largest power of two (<= 256, cuBLASLt's default assumption) dividing the address:
// callers pass row slices of bigger buffers, and an algorithm that assumes more alignment
// than the pointer has reads out of bounds or faults.
uint32_t alignment_bytes(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  uint32_t align = 256;
  while (align > 1 && (a % align) != 0) align /= 2;
  return align;
}

}  // namespace

const Blas::Plan& Blas::plan(cudaDataType_t ab_type, cudaDataType_t cd_type, int out_features, int n_tokens,
                             int in_features, const void* w, const void* x, const void* y, int batch) {
  const uint32_t align_w = alignment_bytes(w), align_x = alignment_bytes(x), align_y = alignment_bytes(y);
  const PlanKey key{static_cast<int>(ab_type), static_cast<int>(cd_type), out_features, n_tokens, in_features,
                    static_cast<int>(align_w), static_cast<int>(align_x), static_cast<int>(align_y), batch};
  if (auto it = plans_.find(key); it != plans_.end()) return it->second;

  Plan p;
  CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t trans_a = CUBLAS_OP_T, trans_b = CUBLAS_OP_N;
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &trans_a, sizeof(trans_a)));
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &trans_b, sizeof(trans_b)));
  // A = W' [in, out] (used transposed), B = X' [in, T], C = D = Y [out, T]; all column-major.
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.a, ab_type, in_features, out_features, in_features));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.b, ab_type, in_features, n_tokens, in_features));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.c, cd_type, out_features, n_tokens, out_features));
  if (batch > 1) {
    // Strided batch: the weights back to back, x shared (stride 0), the outputs back to back.
    const int32_t count = batch;
    const int64_t stride_a = static_cast<int64_t>(out_features) * in_features, stride_b = 0,
                  stride_c = static_cast<int64_t>(out_features) * n_tokens;
    for (auto [layout, stride] : {std::pair{p.a, stride_a}, std::pair{p.b, stride_b}, std::pair{p.c, stride_c}}) {
      CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)));
      CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride,
                                                    sizeof(stride)));
    }
  }

  cublasLtMatmulPreference_t pref = nullptr;
  CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const uint64_t ws = workspace_bytes_;
  const uint32_t reduction = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;  // (NONE is always allowed)
  cublasLtMatmulHeuristicResult_t result{};
  int n_results = 0;
  cublasStatus_t st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                                           sizeof(ws));
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &reduction,
                                              sizeof(reduction));
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_w,
                                              sizeof(align_w));
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_x,
                                              sizeof(align_x));
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_y,
                                              sizeof(align_y));
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_y,
                                              sizeof(align_y));
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulAlgoGetHeuristic(lt_, p.desc, p.a, p.b, p.c, p.c, pref, 1, &result, &n_results);
  cublasLtMatmulPreferenceDestroy(pref);
  if (st == CUBLAS_STATUS_SUCCESS && n_results == 0) st = CUBLAS_STATUS_NOT_SUPPORTED;
  if (st != CUBLAS_STATUS_SUCCESS) {
    cublasLtMatrixLayoutDestroy(p.a);
    cublasLtMatrixLayoutDestroy(p.b);
    cublasLtMatrixLayoutDestroy(p.c);
    cublasLtMatmulDescDestroy(p.desc);
    throw_cuda_error("cublasLtMatmulAlgoGetHeuristic", __FILE__, __LINE__,
                     std::string(cublas_status_name(st)) + " for y[" + std::to_string(n_tokens) + ", " +
                         std::to_string(out_features) + "] = x[" + std::to_string(n_tokens) + ", " +
                         std::to_string(in_features) + "] W^T");
  }
  p.algo = result.algo;
  return plans_.emplace(key, p).first->second;
}

void Blas::matmul(cudaDataType_t ab_type, cudaDataType_t cd_type, const void* x, int n_tokens, const void* w,
                  int out_features, int in_features, void* y, int batch) {
  if (n_tokens < 0 || out_features < 0 || in_features < 0 || batch < 1)
    throw CudaError("Blas::linear: negative size or batch < 1 (" + std::to_string(n_tokens) + ", " +
                    std::to_string(out_features) + ", " + std::to_string(in_features) + ", batch " +
                    std::to_string(batch) + ")");
  if (n_tokens == 0 || out_features == 0) return;
  if (in_features == 0) {  // the empty sum: cuBLASLt rejects k = 0
    const size_t elem = cd_type == CUDA_R_32F ? 4 : 2;
    CUDA_CHECK(cudaMemsetAsync(y, 0, static_cast<size_t>(batch) * n_tokens * out_features * elem, stream_));
    return;
  }
  const Plan& p = plan(ab_type, cd_type, out_features, n_tokens, in_features, w, x, y, batch);
  const float alpha = 1.0f, beta = 0.0f;
  CUBLAS_CHECK(cublasLtMatmul(lt_, p.desc, &alpha, w, p.a, x, p.b, &beta, y, p.c, y, p.c, &p.algo, workspace_,
                              workspace_bytes_, stream_));
}

// Decode sizes (at most 8 tokens, enough output rows to fill the GPU) go to the skinny
// tensor-core kernel (skinny_gemm.h): the same fp32 dot products, at the copy rate.
template <typename Out>
bool Blas::skinny(const bf16* x, int n_tokens, const DeviceLinear& w, int batch, Out* y) {
  if (!skinny_enabled_ || !skinny_linear_supported(x, n_tokens, w.w, w.out_features, w.in_features)) return false;
  skinny_linear(x, n_tokens, w.w, w.out_features, w.in_features, batch, y, stream_);
  return true;
}

void Blas::linear(const bf16* x, int n_tokens, const DeviceLinear& w, float* y) {
  if (skinny(x, n_tokens, w, 1, y)) return;
  matmul(CUDA_R_16BF, CUDA_R_32F, x, n_tokens, w.w, w.out_features, w.in_features, y);
}

void Blas::linear(const bf16* x, int n_tokens, const DeviceLinear& w, bf16* y) {
  if (skinny(x, n_tokens, w, 1, y)) return;
  matmul(CUDA_R_16BF, CUDA_R_16BF, x, n_tokens, w.w, w.out_features, w.in_features, y);
}

void Blas::linear_batched(const bf16* x, int n_tokens, const DeviceLinear& w, int batch, float* y) {
  if (batch >= 1 && skinny(x, n_tokens, w, batch, y)) return;
  matmul(CUDA_R_16BF, CUDA_R_32F, x, n_tokens, w.w, w.out_features, w.in_features, y, batch);
}

void Blas::linear_batched(const bf16* x, int n_tokens, const DeviceLinear& w, int batch, bf16* y) {
  if (batch >= 1 && skinny(x, n_tokens, w, batch, y)) return;
  matmul(CUDA_R_16BF, CUDA_R_16BF, x, n_tokens, w.w, w.out_features, w.in_features, y, batch);
}

void Blas::linear_f32(const float* x, int n_tokens, const float* w, int out_features, int in_features, float* y) {
  matmul(CUDA_R_32F, CUDA_R_32F, x, n_tokens, w, out_features, in_features, y);
}

}  // namespace moonrun::cuda
