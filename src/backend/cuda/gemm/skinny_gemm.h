#pragma once
// Decode-size dense projections on the tensor cores: y[t, o] = sum_i x[t, i] * W[o, i] for at
// most 8 tokens, bf16 x and W, fp32 accumulation - the contract of Blas::linear (blas.h), which
// hands these shapes here. At one to eight tokens a projection is a stream of its weights;
// cuBLASLt's split-K kernels for them ran at 2.5-2.8 TB/s on an H200 for K3's 7168 x 12288
// and 7168 x 3584 (plus a separate split-K reduction), where the copy rate is ~4.2.
#include <cuda_runtime_api.h>

#include "backend/cuda/common/bf16.h"

namespace moonrun::cuda {

// Whether skinny_linear takes this call: 1..8 tokens, in a multiple of 64, out a multiple of
// 16 and large enough to give every multiprocessor a block, 16-byte aligned x and W.
bool skinny_linear_supported(const bf16* x, int n_tokens, const bf16* w, int out_features, int in_features);

// `batch` matrices [out, in] back to back from w over the same x (Blas::linear_batched's
// layout): y_b = y + b * n_tokens * out.
void skinny_linear(const bf16* x, int n_tokens, const bf16* w, int out_features, int in_features, int batch, float* y,
                   cudaStream_t stream);
void skinny_linear(const bf16* x, int n_tokens, const bf16* w, int out_features, int in_features, int batch, bf16* y,
                   cudaStream_t stream);

}  // namespace moonrun::cuda
