// The load-time re-layout of MXFP4 codes (mxfp4_pairs.h): every 32-bit word of a stacked
// expert matrix's codes rewritten in place, once, right after the loader has uploaded it.
#include <algorithm>
#include <cstdint>
#include <string>

#include "backend/cuda/common/cuda_check.h"
#include "backend/cuda/moe/moe_ops.h"
#include "backend/cuda/moe/mxfp4_pairs.h"

namespace moonrun::cuda {
namespace {

__global__ void repack_mxfp4_kernel(uint32_t* words, int64_t n_words) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n_words;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    words[i] = mxfp4_pairs::relay_word(words[i]);
}

}  // namespace

void repack_mxfp4_codes(void* codes, size_t bytes, cudaStream_t stream) {
  if (bytes == 0) return;
  if (bytes % 4 != 0 || reinterpret_cast<uintptr_t>(codes) % 4 != 0)
    throw CudaError("repack_mxfp4_codes: " + std::to_string(bytes) + " bytes at a pointer not of whole words");
  const int64_t n_words = static_cast<int64_t>(bytes / 4);
  const int blocks = static_cast<int>(std::min<int64_t>((n_words + 255) / 256, 132 * 8));
  repack_mxfp4_kernel<<<blocks, 256, 0, stream>>>(static_cast<uint32_t*>(codes), n_words);
  CUDA_CHECK_LAUNCH();
}

}  // namespace moonrun::cuda
