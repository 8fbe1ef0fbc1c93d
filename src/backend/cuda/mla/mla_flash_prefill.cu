// MLA prefill on Hopper's warpgroup MMAs (wgmma, sm_90a): the plain evaluation order of
// mla_attention.cu (keys [k_nope_h | k_pe], values v_h, kv = kv_b(latents)) as a
// FlashAttention kernel for K3's head dims (nope + rope = 192, v = 128), over one block of
// keys at a time, so a chunk's attention to a long cached prefix needs one block's
// expansion in memory, never the whole prefix's (cuda_ops.cpp walks the blocks).
//
// Layout. Every operand is packed once into the tiles the kernel copies whole (one
// cp.async.bulk each, no address arithmetic in the loop): Q as [head][128-query tile][3 blocks
// of 64 dims][128 rows][64], K as [head][128-key tile][3][128][64], V transposed as
// [head][128-key tile][2 blocks of 64 keys][128 value dims][64], each [rows][64] block in
// wgmma's 128-byte swizzle (common/wgmma.cuh). The packing kernels below write them from the
// fp32 queries, the bf16 kv_b output and the cached k_pe.
//
// The kernel: one block per (128 queries, head), 9 warps. Warp 8 is the producer: it copies
// the Q tile, then streams K/V tiles through two stages, each filled on a `full` mbarrier
// (bytes counted by the copy engine) and released on an `empty` one (every consumer thread
// arrives when its warpgroup's MMAs on the stage are done). Warps 0-7 are two consumer
// warpgroups of 64 query rows: S = Q K^T (12 m64n128k16 MMAs from shared memory), the online
// softmax in registers (base-2 exponentials on pre-scaled scores), P rounded to bf16 straight
// into the A fragments of O += P V (8 MMAs with A from registers: the accumulator layout of
// S is the register-A layout of the next product), fp32 accumulation. The epilogue merges
// the block's normalised output and log-sum-exp into the running (o, lse) of the earlier
// blocks (or writes them, for the first), so the blocks need no extra pass.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>

#include "backend/cuda/common/bulk_copy.cuh"
#include "backend/cuda/common/cuda_check.h"
#include "backend/cuda/common/mma.cuh"
#include "backend/cuda/common/wgmma.cuh"
#include "backend/cuda/mla/mla_device.cuh"

namespace moonrun::cuda {

using namespace mla_detail;

namespace {

constexpr int kDqk = 192;                              // nope + rope (K3, K2, Kimi Linear)
constexpr int kDv = 128;                               // v
constexpr int kTile = 128;                             // queries a block, keys a stage
constexpr int kQkBlocks = kDqk / 64;                   // 64-wide column blocks of Q and K rows
constexpr int kPvBlocks = kTile / 64;                  // 64-key column blocks of V^T rows
constexpr uint32_t kBlockBytes = kTile * 128;          // one swizzled [128][64] bf16 block
constexpr uint32_t kQTileBytes = kQkBlocks * kBlockBytes;  // 48 KB
constexpr uint32_t kKTileBytes = kQkBlocks * kBlockBytes;  // 48 KB
constexpr uint32_t kVTileBytes = kPvBlocks * kBlockBytes;  // 32 KB
constexpr int kStages = 2;
constexpr int kConsumerThreads = 256;                  // two warpgroups
constexpr int kBlockThreads = kConsumerThreads + 32;   // and the producer warp
constexpr size_t kSmemBytes = 1024 + kQTileBytes + kStages * (kKTileBytes + kVTileBytes) + 64;
constexpr float kLog2e = 1.4426950408889634f;

__host__ __device__ inline int tiles_of(int n) { return (n + kTile - 1) / kTile; }

struct AttendArgs {
  const unsigned char* q_tiles;  // [H][n_q_tiles] tiles of kQTileBytes
  const unsigned char* k_tiles;  // [H][n_k_tiles] tiles of kKTileBytes
  const unsigned char* v_tiles;  // [H][n_k_tiles] tiles of kVTileBytes
  int n_tokens, n_q_tiles, n_keys, n_k_tiles, num_heads;
  int diag;           // query i sees the block's keys j <= diag + i (and j < n_keys)
  bool first;         // no earlier block: write (o, lse) instead of merging
  float scale_log2;   // softmax scale * log2(e)
  float* o;           // [n_tokens, H, kDv] fp32, normalised over the blocks so far
  float* lse;         // [n_tokens, H] base-2 log-sum-exp of the scaled scores so far
};

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

__global__ void __launch_bounds__(kBlockThreads, 1) attend_kernel(const AttendArgs a) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ unsigned char smem_raw[];
  // Swizzled blocks must start on 1024-byte boundaries.
  unsigned char* smem = reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t{1023});
  unsigned char* q_s = smem;
  unsigned char* k_s = q_s + kQTileBytes;            // [kStages]
  unsigned char* v_s = k_s + kStages * kKTileBytes;  // [kStages]
  uint64_t* q_bar = reinterpret_cast<uint64_t*>(v_s + kStages * kVTileBytes);
  uint64_t* full = q_bar + 1;
  uint64_t* empty = full + kStages;

  const int h = blockIdx.y;
  const int qt = a.n_q_tiles - 1 - static_cast<int>(blockIdx.x);  // the rows with the most keys first
  const int q0 = qt * kTile;
  const int q_last = min(q0 + kTile, a.n_tokens) - 1;
  const int n_tiles = tiles_of(min(a.n_keys, a.diag + q_last + 1));
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

  if (threadIdx.x == 0) {
    mbar_init(q_bar, 1);
    for (int s = 0; s < kStages; ++s) {
      mbar_init(&full[s], 1);
      mbar_init(&empty[s], kConsumerThreads);
    }
  }
  __syncthreads();

  if (warp == kConsumerThreads / 32) {  // the producer
    if (lane == 0) {
      mbar_arrive_expect_tx(q_bar, kQTileBytes);
      bulk_copy(q_s, a.q_tiles + (static_cast<int64_t>(h) * a.n_q_tiles + qt) * kQTileBytes, kQTileBytes, q_bar);
      const int64_t tile0 = static_cast<int64_t>(h) * a.n_k_tiles;
      for (int kt = 0; kt < n_tiles; ++kt) {
        const int s = kt % kStages;
        if (kt >= kStages) mbar_wait(&empty[s], ((kt / kStages) - 1) & 1);
        mbar_arrive_expect_tx(&full[s], kKTileBytes + kVTileBytes);
        bulk_copy(k_s + s * kKTileBytes, a.k_tiles + (tile0 + kt) * kKTileBytes, kKTileBytes, &full[s]);
        bulk_copy(v_s + s * kVTileBytes, a.v_tiles + (tile0 + kt) * kVTileBytes, kVTileBytes, &full[s]);
      }
    }
    return;
  }

  // A consumer: warpgroup wg owns query rows q0 + 64 wg .. + 63; this thread rows r0, r0 + 8
  // of them (the accumulator layout: warp w of the group rows 16w .. 16w + 15, g = lane / 4
  // its row, t = lane % 4 its column pair in each 8-column block).
  const int wg = warp / 4, g = lane / 4, t = lane % 4;
  const int wg_first = q0 + 64 * wg;
  const int r0 = wg_first + 16 * (warp % 4) + g, r1 = r0 + 8;
  float o_acc[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) o_acc[i] = 0.0f;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;  // l: this thread's partial row sums

  mbar_wait(q_bar, 0);
  const uint32_t q_base = smem_address(q_s) + 64 * 128 * wg;  // the group's 64 rows of each block
  for (int kt = 0; kt < n_tiles; ++kt) {
    const int s = kt % kStages;
    mbar_wait(&full[s], (kt / kStages) & 1);
    const uint32_t k_base = smem_address(k_s + s * kKTileBytes);
    const uint32_t v_base = smem_address(v_s + s * kVTileBytes);

    // S = Q K^T over the 192 dims: 3 blocks x 4 k16 steps.
    float sc[64];
    wgmma::fence();
#pragma unroll
    for (int kb = 0; kb < kQkBlocks; ++kb)
#pragma unroll
      for (int k = 0; k < 4; ++k)
        wgmma::mma_m64n128k16_ss(sc, wgmma::desc_sw128(q_base + kb * kBlockBytes + 32 * k),
                                 wgmma::desc_sw128(k_base + kb * kBlockBytes + 32 * k), kb + k > 0);
    wgmma::commit();
    wgmma::wait<0>();
    wgmma::fence_operands(sc);

    // Scores to the base-2 domain; mask keys past the block or the row's diagonal (only a
    // tile that reaches either needs it).
    const int key0 = kt * kTile;
    const bool masked = key0 + kTile > a.n_keys || key0 + kTile - 1 > a.diag + wg_first;
    float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
    for (int j = 0; j < 16; ++j) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float v0 = sc[4 * j + e] * a.scale_log2, v1 = sc[4 * j + 2 + e] * a.scale_log2;
        if (masked) {
          const int key = key0 + 8 * j + 2 * t + e;
          if (key >= a.n_keys || key > a.diag + r0) v0 = -INFINITY;
          if (key >= a.n_keys || key > a.diag + r1) v1 = -INFINITY;
        }
        sc[4 * j + e] = v0;
        sc[4 * j + 2 + e] = v1;
        mx0 = fmaxf(mx0, v0);
        mx1 = fmaxf(mx1, v1);
      }
    }
    // A row lives in the four lanes of one g: two shuffles make its max whole.
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
    const float mn0 = fmaxf(m0, mx0), mn1 = fmaxf(m1, mx1);
    // A row with nothing visible yet keeps max -inf: exponentials against 0 give 0, not NaN.
    const float base0 = mn0 == -INFINITY ? 0.0f : mn0, base1 = mn1 == -INFINITY ? 0.0f : mn1;
    const float f0 = exp2f(m0 - base0), f1 = exp2f(m1 - base1);
    float s0 = 0.0f, s1 = 0.0f;
    uint32_t pa[8][4];  // P as the A fragments of the 8 k16 steps over the tile's keys
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      const float p00 = exp2f(sc[4 * j] - base0), p01 = exp2f(sc[4 * j + 1] - base0);
      const float p10 = exp2f(sc[4 * j + 2] - base1), p11 = exp2f(sc[4 * j + 3] - base1);
      s0 += p00 + p01;
      s1 += p10 + p11;
      // Keys 16i + 2t (+1) are column block 2i, keys 16i + 8 + 2t (+1) block 2i + 1.
      pa[j / 2][(j % 2) * 2 + 0] = pack_bf16(p00, p01);
      pa[j / 2][(j % 2) * 2 + 1] = pack_bf16(p10, p11);
    }
    l0 = l0 * f0 + s0;
    l1 = l1 * f1 + s1;
    m0 = mn0;
    m1 = mn1;
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      o_acc[4 * j] *= f0;
      o_acc[4 * j + 1] *= f0;
      o_acc[4 * j + 2] *= f1;
      o_acc[4 * j + 3] *= f1;
    }

    // O += P V: B is V^T (value dims x keys), K-major; k16 step i reads keys 16i .. 16i + 15.
    wgmma::fence();
#pragma unroll
    for (int i = 0; i < kTile / 16; ++i)
      wgmma::mma_m64n128k16_rs(o_acc, pa[i], wgmma::desc_sw128(v_base + (i / 4) * kBlockBytes + 32 * (i % 4)), true);
    wgmma::commit();
    wgmma::wait<0>();
    wgmma::fence_operands(o_acc);
    mbar_arrive(&empty[s]);
  }

  // The rows' sums over their four lanes; then o = O / l merged with the earlier blocks.
  l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
  l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = half ? r1 : r0;
    const float l = half ? l1 : l0, m = half ? m1 : m0;
    const bool live = row < a.n_tokens;
    const int64_t th = static_cast<int64_t>(row) * a.num_heads + h;
    const float lse_blk = m + log2f(l);
    float w_old = 0.0f, w_new = 1.0f / l, lse_out = lse_blk;
    if (!a.first) {
      const float lse_old = live ? a.lse[th] : 0.0f;
      const float M = fmaxf(lse_old, lse_blk);
      const float e_old = exp2f(lse_old - M), e_new = exp2f(lse_blk - M);
      const float inv = 1.0f / (e_old + e_new);
      w_old = e_old * inv;
      w_new = e_new * inv / l;
      lse_out = M + log2f(e_old + e_new);
    }
    __syncwarp();  // every lane has read lse before lane t == 0 writes it
    if (!live) continue;
    float* orow = a.o + th * kDv;
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      float2* dst = reinterpret_cast<float2*>(orow + 8 * j + 2 * t);
      float2 v = make_float2(o_acc[4 * j + 2 * half] * w_new, o_acc[4 * j + 2 * half + 1] * w_new);
      if (!a.first) {
        const float2 old = *dst;
        v.x += old.x * w_old;
        v.y += old.y * w_old;
      }
      *dst = v;
    }
    if (t == 0) a.lse[th] = lse_out;
  }
#else
  __trap();
#endif
}

// ---- packing ------------------------------------------------------------------------------
// One thread per 16-byte chunk of the output tiles: chunk c of row r of block kb of tile
// (h, tile) lands at sw128_offset(r, 8c).

// q [n_tokens, H, 192] fp32 -> Q tiles (rows past n_tokens zero).
__global__ void pack_q_kernel(const float* __restrict__ q, int n_tokens, int num_heads, int n_q_tiles,
                              unsigned char* __restrict__ tiles) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t n_chunks = static_cast<int64_t>(num_heads) * n_q_tiles * kQkBlocks * kTile * 8;
  if (i >= n_chunks) return;
  const int c = i % 8, r = (i / 8) % kTile, kb = (i / (8 * kTile)) % kQkBlocks;
  const int64_t tile = i / (8 * kTile * kQkBlocks);
  const int qt = tile % n_q_tiles, h = static_cast<int>(tile / n_q_tiles);
  const int tok = qt * kTile + r;
  uint4 out = make_uint4(0, 0, 0, 0);
  if (tok < n_tokens) {
    const float4* src = reinterpret_cast<const float4*>(q + (static_cast<int64_t>(tok) * num_heads + h) * kDqk + kb * 64 + 8 * c);
    const float4 x = src[0], y = src[1];
    out = make_uint4(pack_bf16(x.x, x.y), pack_bf16(x.z, x.w), pack_bf16(y.x, y.y), pack_bf16(y.z, y.w));
  }
  *reinterpret_cast<uint4*>(tiles + tile * kQTileBytes + kb * kBlockBytes + sw128_offset(r, 8 * c)) = out;
}

// kv [n_keys, H, nope + v] bf16 (kv_b's output) and kpe [n_keys, rope] bf16 -> K tiles
// (each key row [k_nope | k_pe]; rows past n_keys zero).
__global__ void pack_k_kernel(const bf16* __restrict__ kv, const bf16* __restrict__ kpe, int n_keys, int num_heads,
                              int nope, int rope, int v_dim, int n_k_tiles, unsigned char* __restrict__ tiles) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t n_chunks = static_cast<int64_t>(num_heads) * n_k_tiles * kQkBlocks * kTile * 8;
  if (i >= n_chunks) return;
  const int c = i % 8, r = (i / 8) % kTile, kb = (i / (8 * kTile)) % kQkBlocks;
  const int64_t tile = i / (8 * kTile * kQkBlocks);
  const int kt = tile % n_k_tiles, h = static_cast<int>(tile / n_k_tiles);
  const int key = kt * kTile + r, col = kb * 64 + 8 * c;
  uint4 out = make_uint4(0, 0, 0, 0);
  if (key < n_keys) {
    const bf16* src = col < nope ? kv + (static_cast<int64_t>(key) * num_heads + h) * (nope + v_dim) + col
                                 : kpe + static_cast<int64_t>(key) * rope + (col - nope);
    out = *reinterpret_cast<const uint4*>(src);
  }
  *reinterpret_cast<uint4*>(tiles + tile * kKTileBytes + kb * kBlockBytes + sw128_offset(r, 8 * c)) = out;
}

// kv's value part -> V^T tiles: one block per (key tile, head) transposes [128 keys][128 dims]
// through shared memory (rows padded by 16 bytes against bank conflicts).
constexpr int kVtStride = kDv + 8;
__global__ void __launch_bounds__(256) pack_vt_kernel(const bf16* __restrict__ kv, int n_keys, int num_heads, int nope,
                                                      int n_k_tiles, unsigned char* __restrict__ tiles) {
  __shared__ __align__(16) bf16 v_s[kTile * kVtStride];
  const int kt = blockIdx.x, h = blockIdx.y;
  for (int i = threadIdx.x; i < kTile * (kDv / 8); i += blockDim.x) {
    const int r = i / (kDv / 8), c = i % (kDv / 8), key = kt * kTile + r;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (key < n_keys)
      v = *reinterpret_cast<const uint4*>(kv + (static_cast<int64_t>(key) * num_heads + h) * (nope + kDv) + nope + 8 * c);
    *reinterpret_cast<uint4*>(v_s + r * kVtStride + 8 * c) = v;
  }
  __syncthreads();
  unsigned char* tile = tiles + (static_cast<int64_t>(h) * n_k_tiles + kt) * kVTileBytes;
  for (int i = threadIdx.x; i < kPvBlocks * kDv * 8; i += blockDim.x) {
    const int c = i % 8, d = (i / 8) % kDv, kb = i / (8 * kDv);
    const bf16* col = v_s + (kb * 64 + 8 * c) * kVtStride + d;
    uint32_t w[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const __nv_bfloat162 pair = __halves2bfloat162(col[(2 * e) * kVtStride], col[(2 * e + 1) * kVtStride]);
      w[e] = *reinterpret_cast<const uint32_t*>(&pair);
    }
    *reinterpret_cast<uint4*>(tile + kb * kBlockBytes + sw128_offset(d, 8 * c)) = make_uint4(w[0], w[1], w[2], w[3]);
  }
}

int blocks_for(int64_t threads, int per_block) { return static_cast<int>((threads + per_block - 1) / per_block); }

}  // namespace

bool mla_wgmma_prefill_supported(const MlaShape& s) {
  return s.nope + s.rope == kDqk && s.v_dim == kDv && s.nope % 8 == 0 && s.rope % 8 == 0;
}

size_t mla_wgmma_q_tiles_bytes(int n_tokens, int num_heads) {
  return static_cast<size_t>(num_heads) * tiles_of(n_tokens) * kQTileBytes;
}
size_t mla_wgmma_kv_tiles_bytes(int n_keys, int num_heads) {
  return static_cast<size_t>(num_heads) * tiles_of(n_keys) * (kKTileBytes + kVTileBytes);
}

void mla_wgmma_pack_q(const float* q, int n_tokens, int num_heads, void* q_tiles, cudaStream_t stream) {
  if (n_tokens <= 0) return;
  const int n_q_tiles = tiles_of(n_tokens);
  const int64_t chunks = static_cast<int64_t>(num_heads) * n_q_tiles * kQkBlocks * kTile * 8;
  pack_q_kernel<<<blocks_for(chunks, 256), 256, 0, stream>>>(q, n_tokens, num_heads, n_q_tiles,
                                                             static_cast<unsigned char*>(q_tiles));
  CUDA_CHECK_LAUNCH();
}

void mla_wgmma_pack_kv(const bf16* kv, const bf16* kpe, int n_keys, const MlaShape& shape, void* kv_tiles,
                       cudaStream_t stream) {
  if (n_keys <= 0) return;
  const int H = shape.num_heads, n_k_tiles = tiles_of(n_keys);
  unsigned char* k_tiles = static_cast<unsigned char*>(kv_tiles);
  unsigned char* v_tiles = k_tiles + static_cast<size_t>(H) * n_k_tiles * kKTileBytes;
  const int64_t chunks = static_cast<int64_t>(H) * n_k_tiles * kQkBlocks * kTile * 8;
  pack_k_kernel<<<blocks_for(chunks, 256), 256, 0, stream>>>(kv, kpe, n_keys, H, shape.nope, shape.rope, shape.v_dim,
                                                             n_k_tiles, k_tiles);
  CUDA_CHECK_LAUNCH();
  pack_vt_kernel<<<dim3(n_k_tiles, H), 256, 0, stream>>>(kv, n_keys, H, shape.nope, n_k_tiles, v_tiles);
  CUDA_CHECK_LAUNCH();
}

void mla_wgmma_attend(const void* q_tiles, const void* kv_tiles, int n_tokens, int n_keys, int diag, bool first,
                      const MlaShape& shape, float* o, float* lse, cudaStream_t stream) {
  if (n_tokens <= 0 || n_keys <= 0) return;
  const int H = shape.num_heads;
  AttendArgs a{};
  a.q_tiles = static_cast<const unsigned char*>(q_tiles);
  a.k_tiles = static_cast<const unsigned char*>(kv_tiles);
  a.n_tokens = n_tokens;
  a.n_q_tiles = tiles_of(n_tokens);
  a.n_keys = n_keys;
  a.n_k_tiles = tiles_of(n_keys);
  a.v_tiles = a.k_tiles + static_cast<size_t>(H) * a.n_k_tiles * kKTileBytes;
  a.num_heads = H;
  a.diag = diag;
  a.first = first;
  a.scale_log2 = kLog2e / std::sqrt(static_cast<float>(shape.nope + shape.rope));
  a.o = o;
  a.lse = lse;
  allow_dynamic_smem(attend_kernel, kSmemBytes);
  attend_kernel<<<dim3(a.n_q_tiles, H), kBlockThreads, kSmemBytes, stream>>>(a);
  CUDA_CHECK_LAUNCH();
}

}  // namespace moonrun::cuda
