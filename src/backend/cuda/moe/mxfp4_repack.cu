// The load-time re-layout of MXFP4 codes (mxfp4_pairs.h): every 32-bit word of a stacked
// expert matrix's codes rewritten in place, once, right after the loader has uploaded it.
// And of INT4 words (int4_pairs.h), eight-word slices at a time, for MOONRUN_INT4_FAST.
#include <algorithm>
#include <cstdint>
#include <string>

#include "backend/cuda/common/cuda_check.h"
#include "backend/cuda/moe/int4_pairs.h"
#include "backend/cuda/moe/moe_ops.h"
#include "backend/cuda/moe/mxfp4_pairs.h"

namespace moonrun::cuda {
namespace {

__global__ void repack_mxfp4_kernel(uint32_t* words, int64_t n_words) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n_words;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    words[i] = mxfp4_pairs::relay_word(words[i]);
}

// One thread a 64-wide slice: read its eight words, write them re-laid (in place, so the
// whole slice is in registers first).
__global__ void repack_int4_kernel(uint32_t* words, int64_t n_slices) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n_slices;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    uint32_t in[int4_pairs::kSliceWords], out[int4_pairs::kSliceWords];
    uint32_t* slice = words + i * int4_pairs::kSliceWords;
#pragma unroll
    for (int w = 0; w < int4_pairs::kSliceWords; ++w) in[w] = slice[w];
    int4_pairs::relay_slice(in, out);
#pragma unroll
    for (int w = 0; w < int4_pairs::kSliceWords; ++w) slice[w] = out[w];
  }
}

}  // namespace

void repack_int4_words(void* words, size_t bytes, cudaStream_t stream) {
  if (bytes == 0) return;
  constexpr size_t kSliceBytes = 4 * int4_pairs::kSliceWords;
  if (bytes % kSliceBytes != 0 || reinterpret_cast<uintptr_t>(words) % 4 != 0)
    throw CudaError("repack_int4_words: " + std::to_string(bytes) + " bytes, not whole 64-wide slices of words");
  const int64_t n_slices = static_cast<int64_t>(bytes / kSliceBytes);
  const int blocks = static_cast<int>(std::min<int64_t>((n_slices + 255) / 256, 132 * 8));
  repack_int4_kernel<<<blocks, 256, 0, stream>>>(static_cast<uint32_t*>(words), n_slices);
  CUDA_CHECK_LAUNCH();
}

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
