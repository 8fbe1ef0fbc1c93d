#pragma once
// Hopper's warpgroup matrix multiply (wgmma, sm_90a): four consecutive warps (a warpgroup,
// starting at a warp index divisible by 4) issue one asynchronous MMA over 64 rows of A;
// B (and A, or A from registers) come from shared memory through 64-bit descriptors. The
// kernels that use it (mla/mla_flash_prefill.cu, mla/mla_decode_heads.cu,
// moe/expert_linear_wgmma.cu) compile it only for sm_90a: the plain sm_90
// pass of the same file gets a body that traps, and the host asks wgmma_available() (a probe
// kernel, common/device_info.h) before it launches one.
//
// The one shared-memory layout used here: K-major operands in blocks of [rows][64] bf16
// (128 bytes a row) with the 128-byte swizzle, each block 1024-byte aligned. Within each
// 8-row, 1024-byte atom the 16-byte chunk c of row r sits at chunk position c ^ (r % 8), so
// a warp reading one column of chunks touches every bank once. A descriptor gives the
// start, the stride between 8-row atoms (SBO, 1024 B) and the swizzle mode; a k16 step
// inside a block moves the start by 32 bytes (the hardware applies the XOR to the address).
#include <cuda_runtime.h>

#include <cstdint>

namespace moonrun::cuda {

// Byte offset of element (row, col), col < 64, inside one swizzled [rows][64] bf16 block.
__host__ __device__ constexpr uint32_t sw128_offset(int row, int col) {
  return static_cast<uint32_t>(row) * 128u + (static_cast<uint32_t>(((col >> 3) ^ row) & 7) << 4) +
         static_cast<uint32_t>(col & 7) * 2u;
}

// Makes this thread's ordinary (and cp.async) writes to shared memory visible to the async
// proxy - the MMAs' operand reads - once a barrier follows (HOPPER.md).
__device__ __forceinline__ void fence_view_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

namespace wgmma {

// A K-major, 128-byte-swizzled operand starting at shared address `smem_addr` (1024-byte
// aligned block base plus a multiple of 32 bytes along K, or of 1024 along the rows).
__device__ __forceinline__ uint64_t desc_sw128(uint32_t smem_addr) {
  uint64_t d = (smem_addr & 0x3FFFFu) >> 4;  // start address, 16-byte units (bits 0-13)
  d |= uint64_t{1} << 16;                    // leading byte offset: unused by swizzled K-major layouts
  d |= uint64_t{1024 >> 4} << 32;            // stride byte offset: one 8-row atom
  d |= uint64_t{1} << 62;                    // 128-byte swizzle
  return d;
}

// The same for an MN-major operand (a transposed A): rows of the 1024-byte atoms run along K
// (128 bytes of 64 M elements each), the stride byte offset is again one 8-row atom (along
// K), and the leading byte offset the distance between 64-element blocks along M.
__device__ __forceinline__ uint64_t desc_sw128_mn(uint32_t smem_addr, uint32_t m_block_bytes) {
  uint64_t d = (smem_addr & 0x3FFFFu) >> 4;
  d |= static_cast<uint64_t>((m_block_bytes >> 4) & 0x3FFFu) << 16;
  d |= uint64_t{1024 >> 4} << 32;
  d |= uint64_t{1} << 62;
  return d;
}

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// Orders this thread's earlier register writes (accumulators, A fragments) before the next wgmma.
__device__ __forceinline__ void fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
#else
__device__ __forceinline__ void fence() { __trap(); }
__device__ __forceinline__ void commit() { __trap(); }
template <int N>
__device__ __forceinline__ void wait() { __trap(); }
#endif

// Keeps the compiler from moving reads or writes of an accumulator across a wgmma wait: the
// asm statements are ordered, and this one claims to rewrite every register of the array.
template <int N>
__device__ __forceinline__ void fence_operands(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// D[64 x 128] (+)= A[64 x 16] B[16 x 128], A and B in shared memory (K-major, 128-byte swizzle).
__device__ __forceinline__ void mma_m64n128k16_ss(float (&d)[64], uint64_t desc_a, uint64_t desc_b, bool accumulate) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(desc_a), "l"(desc_b), "r"(static_cast<int>(accumulate)));
}
// The same with A in registers (four bf16 pairs a thread, mma.sync's m16n8k16 A layout per warp).
__device__ __forceinline__ void mma_m64n128k16_rs(float (&d)[64], const uint32_t (&a)[4], uint64_t desc_b, bool accumulate) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(static_cast<int>(accumulate)));
}

// D[64 x 64] (+)= A[64 x 16] B[16 x 64], A in registers, B in shared memory (as above).
__device__ __forceinline__ void mma_m64n64k16_rs(float (&d)[32], const uint32_t (&a)[4], uint64_t desc_b, bool accumulate) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(static_cast<int>(accumulate)));
}
// D[64 x 16] (+)= A[64 x 16] B[16 x 16] from shared memory; kTransA: A is MN-major (its M
// elements contiguous: desc_sw128_mn), else K-major.
template <bool kTransA>
__device__ __forceinline__ void mma_m64n16k16_ss(float (&d)[8], uint64_t desc_a, uint64_t desc_b, bool accumulate) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %10, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, p, 1, 1, %11, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
      : "l"(desc_a), "l"(desc_b), "r"(static_cast<int>(accumulate)), "n"(kTransA ? 1 : 0));
}
// D[64 x 32] (+)= A[64 x 16] B[16 x 32] from shared memory; kTransA: A is MN-major (its M
// elements contiguous: desc_sw128_mn), else K-major.
template <bool kTransA>
__device__ __forceinline__ void mma_m64n32k16_ss(float (&d)[16], uint64_t desc_a, uint64_t desc_b, bool accumulate) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, 1, %19, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "l"(desc_a), "l"(desc_b), "r"(static_cast<int>(accumulate)), "n"(kTransA ? 1 : 0));
}
// D[64 x 48] (+)= A[64 x 16] B[16 x 48] from shared memory; kTransA: A is MN-major (its M
// elements contiguous: desc_sw128_mn), else K-major.
template <bool kTransA>
__device__ __forceinline__ void mma_m64n48k16_ss(float (&d)[24], uint64_t desc_a, uint64_t desc_b, bool accumulate) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %26, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n48k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23}, %24, %25, p, 1, 1, %27, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23])
      : "l"(desc_a), "l"(desc_b), "r"(static_cast<int>(accumulate)), "n"(kTransA ? 1 : 0));
}
#else
template <bool kTransA>
__device__ __forceinline__ void mma_m64n16k16_ss(float (&)[8], uint64_t, uint64_t, bool) { __trap(); }
template <bool kTransA>
__device__ __forceinline__ void mma_m64n32k16_ss(float (&)[16], uint64_t, uint64_t, bool) { __trap(); }
template <bool kTransA>
__device__ __forceinline__ void mma_m64n48k16_ss(float (&)[24], uint64_t, uint64_t, bool) { __trap(); }
__device__ __forceinline__ void mma_m64n64k16_rs(float (&)[32], const uint32_t (&)[4], uint64_t, bool) { __trap(); }
__device__ __forceinline__ void mma_m64n128k16_ss(float (&)[64], uint64_t, uint64_t, bool) { __trap(); }
__device__ __forceinline__ void mma_m64n128k16_rs(float (&)[64], const uint32_t (&)[4], uint64_t, bool) { __trap(); }
#endif

}  // namespace wgmma
}  // namespace moonrun::cuda
