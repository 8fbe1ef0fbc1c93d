// MLA prefill on the tensor cores for head shapes other than K3's (mla_flash_prefill.cu
// takes nope + rope = 192, v = 128 on Hopper's warpgroup MMAs): the plain evaluation order
// of mla_attention.cu (keys [k_nope_h | k_pe], values v_h, kv = kv_b over one block of the
// sequence's latents), as a FlashAttention-2 style kernel with mma.sync.m16n8k16 (bf16
// operands, fp32 accumulate and fp32 online softmax), writing the block's normalised output
// and log-sum-exp for cuda_ops.cpp to merge. The CUDA-core kernel of mla_attention.cu stays
// the reference: the fp32 mode and shapes this one does not take (nope + rope or v not a
// multiple of 16) run there.
//
// One block per (64 queries, head): 4 warps of 16 query rows. For each tile of 64 keys up to
// the causal limit the block stages K [64][nope + rope] and V transposed [v][64] as bf16 in
// shared memory; a warp computes S = Q K^T for its rows (Q read from shared memory as A
// fragments), masks the keys after each query's position, updates its rows' running max and
// denominator (a row's four owning lanes agree through two shuffles), turns the exponentials
// into the A fragments of P V without leaving registers (the C fragment of S is laid out as
// the A fragment of the next product), and accumulates O in registers.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>

#include "backend/cuda/common/cuda_check.h"
#include "backend/cuda/common/mma.cuh"
#include "backend/cuda/mla/mla_device.cuh"

namespace moonrun::cuda {

using namespace mla_detail;

namespace {

constexpr int kQ = 64;        // queries per block
constexpr int kK = 64;        // keys per tile
constexpr int kFaWarps = 4;   // 16 query rows each
constexpr int kMaxV = 128;    // value width (16 n8 fragments)
constexpr int kMaxQk = 256;   // key width

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

template <typename Cache>
struct FlashArgs {
  const float* q;   // [n_tokens, H, dqk] fp32
  const bf16* kv;   // [n_keys, H, nope + v] bf16: the block's keys, positions key_begin ..
  PagedRows<Cache> cache;
  const int32_t* pages;
  int n_tokens, n_past, key_begin, n_keys, num_heads, kv_lora, nope, rope, v_dim;
  float scale;
  float* o;         // [n_tokens, H, v] fp32, normalised over the block
  float* lse;       // [n_tokens, H] its log-sum-exp (natural log)
};

template <typename Cache>
__global__ void __launch_bounds__(kFaWarps * 32) flash_prefill_kernel(FlashArgs<Cache> a) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int dqk = a.nope + a.rope, qs = dqk + 8, vs = kK + 8;  // row strides (bf16): +16 B against bank conflicts
  bf16* q_s = reinterpret_cast<bf16*>(smem_raw);  // [kQ][qs]
  bf16* k_s = q_s + kQ * qs;                      // [kK][qs]
  bf16* vt_s = k_s + kK * qs;                     // [v][vs]
  const int h = blockIdx.y, q0 = blockIdx.x * kQ, H = a.num_heads;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int kvw = a.nope + a.v_dim;

  // Q tile as bf16 (rows past the sequence are zeros).
  for (int i = threadIdx.x; i < kQ * dqk; i += kFaWarps * 32) {
    const int r = i / dqk, d = i % dqk;
    const float v = q0 + r < a.n_tokens ? a.q[(static_cast<int64_t>(q0 + r) * H + h) * dqk + d] : 0.0f;
    q_s[r * qs + d] = __float2bfloat16_rn(v);
  }
  // This warp's query rows g and g + 8 see positions [0, n_past + row].
  const int row_a = q0 + warp * 16 + g, row_b = row_a + 8;
  // (and not past the block's keys: in a block of the prefix every row's causal limit is beyond them)
  const int block_end = a.key_begin + a.n_keys - 1;
  const int lim_a = min(a.n_past + row_a, block_end), lim_b = min(a.n_past + row_b, block_end);
  // The last key any row of this block of queries sees, within the block of keys.
  const int last_key = min(a.key_begin + a.n_keys, a.n_past + min(q0 + kQ, a.n_tokens)) - 1;
  const int n_vf = a.v_dim / 8;
  float o_acc[kMaxV / 8][4];
#pragma unroll
  for (int u = 0; u < kMaxV / 8; ++u) o_acc[u][0] = o_acc[u][1] = o_acc[u][2] = o_acc[u][3] = 0.0f;
  float m_a = -INFINITY, m_b = -INFINITY, l_a = 0.0f, l_b = 0.0f;

  for (int k0 = a.key_begin; k0 <= last_key; k0 += kK) {
    __syncthreads();  // the previous tile is read (and, the first time, the Q tile written)
    // K tile: [k_nope from kv | k_pe from the cache row], V^T tile from kv.
    for (int i = threadIdx.x; i < kK * dqk; i += kFaWarps * 32) {
      const int r = i / dqk, d = i % dqk, p = k0 + r;
      bf16 v = __float2bfloat16_rn(0.0f);
      if (p <= last_key) {
        if (d < a.nope) v = a.kv[(static_cast<int64_t>(p - a.key_begin) * H + h) * kvw + d];
        else v = __float2bfloat16_rn(ld(a.cache.at(a.pages, p) + a.kv_lora + (d - a.nope)));
      }
      k_s[r * qs + d] = v;
    }
    for (int i = threadIdx.x; i < kK * a.v_dim; i += kFaWarps * 32) {
      const int r = i / a.v_dim, d = i % a.v_dim, p = k0 + r;
      vt_s[d * vs + r] =
          p <= last_key ? a.kv[(static_cast<int64_t>(p - a.key_begin) * H + h) * kvw + a.nope + d]
                        : __float2bfloat16_rn(0.0f);
    }
    __syncthreads();
    if (q0 + warp * 16 >= a.n_tokens) continue;  // this warp's rows are all past the end

    // S = Q K^T: 16 rows x 64 keys (8 n8 fragments).
    float s[kK / 8][4];
#pragma unroll
    for (int f = 0; f < kK / 8; ++f) s[f][0] = s[f][1] = s[f][2] = s[f][3] = 0.0f;
    const bf16* qa = q_s + (warp * 16 + g) * qs;
    const bf16* qb = qa + 8 * qs;
    for (int kk = 0; kk < dqk; kk += 16) {
      const uint32_t a0 = bf16_pair(qa + kk + 2 * t), a1 = bf16_pair(qb + kk + 2 * t);
      const uint32_t a2 = bf16_pair(qa + kk + 2 * t + 8), a3 = bf16_pair(qb + kk + 2 * t + 8);
#pragma unroll
      for (int f = 0; f < kK / 8; ++f) {
        const bf16* kr = k_s + (8 * f + g) * qs + kk + 2 * t;
        mma_m16n8k16_bf16(s[f], a0, a1, a2, a3, bf16_pair(kr), bf16_pair(kr + 8));
      }
    }
    // Scale, causal mask, the rows' running max.
    float mx_a = -INFINITY, mx_b = -INFINITY;
#pragma unroll
    for (int f = 0; f < kK / 8; ++f) {
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int p = k0 + 8 * f + 2 * t + j;
        s[f][j] = p <= lim_a ? s[f][j] * a.scale : -INFINITY;
        s[f][2 + j] = p <= lim_b ? s[f][2 + j] * a.scale : -INFINITY;
        mx_a = fmaxf(mx_a, s[f][j]);
        mx_b = fmaxf(mx_b, s[f][2 + j]);
      }
    }
    for (int off = 1; off < 4; off <<= 1) {
      mx_a = fmaxf(mx_a, __shfl_xor_sync(0xffffffffu, mx_a, off));
      mx_b = fmaxf(mx_b, __shfl_xor_sync(0xffffffffu, mx_b, off));
    }
    const float mn_a = fmaxf(m_a, mx_a), mn_b = fmaxf(m_b, mx_b);
    // A row with nothing visible yet keeps max -inf: its factors and exponentials are 0.
    const float fa = mn_a == -INFINITY ? 1.0f : expf(m_a - mn_a), fb = mn_b == -INFINITY ? 1.0f : expf(m_b - mn_b);
    float sum_a = 0.0f, sum_b = 0.0f;
#pragma unroll
    for (int f = 0; f < kK / 8; ++f) {
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        s[f][j] = mn_a == -INFINITY ? 0.0f : expf(s[f][j] - mn_a);
        s[f][2 + j] = mn_b == -INFINITY ? 0.0f : expf(s[f][2 + j] - mn_b);
        sum_a += s[f][j];
        sum_b += s[f][2 + j];
      }
    }
    for (int off = 1; off < 4; off <<= 1) {
      sum_a += __shfl_xor_sync(0xffffffffu, sum_a, off);
      sum_b += __shfl_xor_sync(0xffffffffu, sum_b, off);
    }
    l_a = l_a * fa + sum_a;
    l_b = l_b * fb + sum_b;
    m_a = mn_a;
    m_b = mn_b;
#pragma unroll
    for (int u = 0; u < kMaxV / 8; ++u) {
      o_acc[u][0] *= fa;
      o_acc[u][1] *= fa;
      o_acc[u][2] *= fb;
      o_acc[u][3] *= fb;
    }
    // O += P V: P's k16 step j is S fragments 2j (keys 16j + 2t..) and 2j + 1 (16j + 8 + 2t..).
#pragma unroll
    for (int j = 0; j < kK / 16; ++j) {
      const uint32_t a0 = pack_bf16(s[2 * j][0], s[2 * j][1]), a1 = pack_bf16(s[2 * j][2], s[2 * j][3]);
      const uint32_t a2 = pack_bf16(s[2 * j + 1][0], s[2 * j + 1][1]);
      const uint32_t a3 = pack_bf16(s[2 * j + 1][2], s[2 * j + 1][3]);
#pragma unroll
      for (int u = 0; u < kMaxV / 8; ++u) {
        if (u >= n_vf) break;
        const bf16* vr = vt_s + (8 * u + g) * vs + 16 * j + 2 * t;
        mma_m16n8k16_bf16(o_acc[u], a0, a1, a2, a3, bf16_pair(vr), bf16_pair(vr + 8));
      }
    }
  }
  // o = O / l and the log-sum-exp, for the rows inside the sequence.
  const float inv_a = l_a > 0 ? 1.0f / l_a : 0.0f, inv_b = l_b > 0 ? 1.0f / l_b : 0.0f;
  if (t == 0) {
    if (row_a < a.n_tokens) a.lse[static_cast<int64_t>(row_a) * H + h] = m_a + logf(l_a);
    if (row_b < a.n_tokens) a.lse[static_cast<int64_t>(row_b) * H + h] = m_b + logf(l_b);
  }
#pragma unroll
  for (int u = 0; u < kMaxV / 8; ++u) {
    if (u >= n_vf) break;
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int d = 8 * u + 2 * t + j;
      if (row_a < a.n_tokens) a.o[(static_cast<int64_t>(row_a) * H + h) * a.v_dim + d] = o_acc[u][j] * inv_a;
      if (row_b < a.n_tokens) a.o[(static_cast<int64_t>(row_b) * H + h) * a.v_dim + d] = o_acc[u][2 + j] * inv_b;
    }
  }
}

size_t flash_smem_bytes(const MlaShape& s) {
  const int qs = s.nope + s.rope + 8;
  return (static_cast<size_t>(kQ + kK) * qs + static_cast<size_t>(s.v_dim) * (kK + 8)) * sizeof(bf16);
}

}  // namespace

bool mla_flash_prefill_mma_supported(const MlaShape& s) {
  const int dqk = s.nope + s.rope;
  return dqk % 16 == 0 && dqk <= kMaxQk && s.v_dim % 16 == 0 && s.v_dim <= kMaxV &&
         flash_smem_bytes(s) <= 200 * 1024;
}

void mla_flash_prefill_mma(const float* q, const bf16* kv, const KvLayer& cache, const int32_t* pages, int n_tokens,
                           int n_past, int key_begin, int n_keys, const MlaShape& shape, float* o, float* lse,
                           cudaStream_t stream) {
  if (n_tokens <= 0) return;
  const size_t smem = flash_smem_bytes(shape);
  const dim3 grid((n_tokens + kQ - 1) / kQ, shape.num_heads);
  const float scale = 1.0f / std::sqrt(static_cast<float>(shape.nope + shape.rope));
  with_cache_type(cache.dtype, [&](auto tag) {
    using Cache = typename decltype(tag)::type;
    allow_dynamic_smem(flash_prefill_kernel<Cache>, smem);
    const FlashArgs<Cache> a{q,           kv,         paged_rows<Cache>(cache), pages,         n_tokens,
                             n_past,      key_begin,  n_keys,                   shape.num_heads, shape.kv_lora,
                             shape.nope,  shape.rope, shape.v_dim,              scale,         o,
                             lse};
    flash_prefill_kernel<Cache><<<grid, kFaWarps * 32, smem, stream>>>(a);
  });
  CUDA_CHECK_LAUNCH();
}

}  // namespace moonrun::cuda
