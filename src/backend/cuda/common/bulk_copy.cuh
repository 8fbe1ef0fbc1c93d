#pragma once
// Asynchronous copies from global to shared memory.
//
// cp.async (sm_80+): 16 bytes a thread, no registers on the way, so a loop of them puts every
// copy in flight before the first lands (a loop of loads and stores waits for each load).
//
// Hopper bulk copies (the TMA engine's one-dimensional form, cp.async.bulk) from global to
// shared memory, completing on an mbarrier that counts the bytes. One instruction moves a
// whole contiguous run (a multiple of 16 bytes, both ends 16-byte aligned), so a few lanes
// keep many kilobytes in flight without registers or per-thread address arithmetic.
#include <cuda_runtime.h>

#include <cstdint>

namespace moonrun::cuda {

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  const auto s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem) : "memory");
}
// Commits this thread's outstanding cp.async copies and waits for all of them (then a
// __syncthreads makes everyone's visible).
__device__ __forceinline__ void cp_async_wait_all() {
  asm volatile("cp.async.commit_group;\ncp.async.wait_group 0;\n" ::: "memory");
}

__device__ __forceinline__ uint32_t smem_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// One thread initialises; fence + __syncthreads before anyone else uses the barrier.
__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_address(bar)), "r"(arrivals) : "memory");
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
// Arrives and announces `bytes` more to come: the phase completes when they all have.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_address(bar)), "r"(bytes)
               : "memory");
}
// Arrives without announcing bytes (a consumer telling the producer a stage is free).
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_address(bar)) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(smem_address(bar)), "r"(parity)
        : "memory");
  } while (!done);
}
__device__ __forceinline__ void bulk_copy(void* smem, const void* gmem, uint32_t bytes, uint64_t* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                   smem_address(smem)),
               "l"(gmem), "r"(bytes), "r"(smem_address(bar))
               : "memory");
}

}  // namespace moonrun::cuda
