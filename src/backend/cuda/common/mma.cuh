#pragma once
// The tensor-core pieces the bf16 kernels share (moe/expert_linear_mma.cu,
// mla/mla_attention.cu, mla/mla_flash_prefill_mma.cu): the one MMA shape they use, a 32-bit
// operand read, and the opt-in to more than 48 KB of dynamic shared memory.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <utility>

#include "backend/cuda/common/bf16.h"
#include "backend/cuda/common/cuda_check.h"

namespace moonrun::cuda {

// c += A B for one m16n8k16 tile: bf16 operands, fp32 accumulators, fragments as the PTX ISA
// lays them out (A: rows g / g + 8, k 2t (+1) / 2t + 8 (+9); B: k 2t (+1) / 2t + 8 (+9), column
// g; C: rows g / g + 8, columns 2t, 2t + 1; g = lane / 4, t = lane % 4).
__device__ __forceinline__ void mma_m16n8k16_bf16(float c[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                                  uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Two consecutive bf16 (4-byte aligned) as one operand register, the lower index in the low half.
__device__ __forceinline__ uint32_t bf16_pair(const bf16* p) { return *reinterpret_cast<const uint32_t*>(p); }

// Lets `kernel` use up to `bytes` of dynamic shared memory on the current device, and with
// all_shared asks for the whole L1/shared carveout as shared memory (where the blocks a
// multiprocessor is meant to hold need it; the driver otherwise may pick a smaller one).
// The attributes belong to the device's context, so they are set once per device (a process
// may drive several GPUs); they are not stream operations, so a call inside a graph capture
// is harmless, but the first call usually comes from an eager step.
template <typename Kernel>
void allow_dynamic_smem(Kernel* kernel, size_t bytes, bool all_shared = false) {
  static std::mutex mu;
  static std::map<std::pair<const void*, int>, size_t> allowed;  // (kernel, device) -> bytes
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  std::lock_guard<std::mutex> lock(mu);
  size_t& have = allowed[{reinterpret_cast<const void*>(kernel), device}];
  if (have >= bytes) return;
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
  if (all_shared && have == 0)
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                    static_cast<int>(cudaSharedmemCarveoutMaxShared)));
  have = bytes;
}

}  // namespace moonrun::cuda
