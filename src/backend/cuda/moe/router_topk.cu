// The MoE router's choice on the GPU: the twin of cpu::route_token (backend/cpu/router.cpp,
// K3_SPEC.md §2 "MoE layer"). One warp per token; the biased scores live in shared memory.
//
// Selection without sorting: the CPU orders experts by (biased score descending, id
// ascending) and takes the first top_k. Here the k-th pick is the best expert strictly
// AFTER the (k-1)-th pick in that total order, found by one warp argmax per pick. Nothing is
// written back between picks, so there is no masking state to race on. The group stage
// (stable_sort of group scores, keep the first topk_group) uses the same rule.
#include <cuda_runtime.h>

#include <climits>
#include <cmath>

#include "backend/cuda/common/cuda_check.h"
#include "backend/cuda/moe/moe_ops.h"

namespace moonrun::cuda {

namespace {

constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kWarpsPerBlock = 4;  // tokens per block

// The CPU's expression, term for term (expf, not __expf: weights must match to ~1e-6).
__device__ __forceinline__ float router_sigmoid(float logit) { return 1.0f / (1.0f + expf(-logit)); }

// A candidate (value, index) and the order the CPU sorts by: larger value first, then lower
// index. An empty candidate is (-inf, INT_MAX): it loses to every real one, -inf included.
struct Pick {
  float v;
  int i;
};
__device__ __forceinline__ bool before(Pick a, Pick b) { return a.v > b.v || (a.v == b.v && a.i < b.i); }

// The warp's best candidate (every lane returns the same).
__device__ __forceinline__ Pick warp_best(Pick p) {
  for (int off = 16; off > 0; off >>= 1) {
    Pick o{__shfl_xor_sync(kFullMask, p.v, off), __shfl_xor_sync(kFullMask, p.i, off)};
    if (before(o, p)) p = o;
  }
  return p;
}

// logits [n_tokens, E]; per warp, shared memory holds choice [E] and group_score [G].
__global__ void router_topk_kernel(const float* __restrict__ logits, const float* __restrict__ bias, int n_tokens,
                                   RouterParams p, int32_t* __restrict__ expert_ids,
                                   float* __restrict__ weights) {
  extern __shared__ float smem[];
  const int E = p.num_experts;
  const bool grouped = p.num_expert_group > 1 && p.num_expert_group > p.topk_group;
  const int G = grouped ? p.num_expert_group : 0;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int t = blockIdx.x * kWarpsPerBlock + warp;
  if (t >= n_tokens) return;  // whole warps leave together: no block-level barrier below
  float* choice = smem + static_cast<size_t>(warp) * (E + G);  // [E] biased scores
  float* group_score = choice + E;                             // [G]
  const float* lg = logits + static_cast<size_t>(t) * E;

  for (int e = lane; e < E; e += 32) choice[e] = router_sigmoid(lg[e]) + (bias ? bias[e] : 0.0f);
  __syncwarp();

  // Groups: score = best + second best biased score; keep the first topk_group groups in
  // (score desc, group asc) order. `last` is the topk_group-th kept group: group g is kept iff
  // it is not after `last`.
  Pick last{INFINITY, -1};
  int per_group = E;
  if (grouped) {
    per_group = E / G;
    for (int g = lane; g < G; g += 32) {
      float best = -INFINITY, second = -INFINITY;  // the CPU's loop, in its order
      for (int e = g * per_group; e < (g + 1) * per_group; ++e) {
        const float c = choice[e];
        if (c > best) {
          second = best;
          best = c;
        } else if (c > second) {
          second = c;
        }
      }
      group_score[g] = best + second;
    }
    __syncwarp();
    for (int k = 0; k < p.topk_group; ++k) {
      Pick mine{-INFINITY, INT_MAX};
      for (int g = lane; g < G; g += 32) {
        const Pick c{group_score[g], g};
        if (before(last, c) && before(c, mine)) mine = c;
      }
      last = warp_best(mine);
    }
  }
  auto biased = [&](int e) {
    if (grouped) {
      const int g = e / per_group;
      const Pick gp{group_score[g], g};
      if (before(last, gp)) return -INFINITY;  // outside the kept groups
    }
    return choice[e];
  };

  // Top-k picks in order; every lane knows every pick, lane k%32 stores pick k.
  int32_t* ids = expert_ids + static_cast<size_t>(t) * p.top_k;
  float* wts = weights + static_cast<size_t>(t) * p.top_k;
  Pick prev{INFINITY, -1};
  float sum = 0.0f;  // the CPU's sequential sum over picks
  for (int k = 0; k < p.top_k; ++k) {
    Pick mine{-INFINITY, INT_MAX};
    for (int e = lane; e < E; e += 32) {
      const Pick c{biased(e), e};
      if (before(prev, c) && before(c, mine)) mine = c;
    }
    prev = warp_best(mine);
    const float w = router_sigmoid(lg[prev.i]);  // unbiased score
    sum += w;
    if (lane == k % 32) {
      ids[k] = prev.i;
      wts[k] = w;
    }
  }
  const bool renorm = p.top_k > 1 && p.renormalize;
  const float denom = sum + 1e-20f;
  for (int k = lane; k < p.top_k; k += 32) {  // each lane rescales only what it stored
    float w = wts[k];
    if (renorm) w /= denom;
    wts[k] = w * p.routed_scaling_factor;
  }
}

}  // namespace

void router_topk(const float* logits, const float* bias, int n_tokens, const RouterParams& p,
                 int32_t* expert_ids, float* weights, cudaStream_t stream) {
  if (n_tokens <= 0) return;
  if (p.num_experts <= 0 || p.top_k <= 0 || p.top_k > p.num_experts)
    throw CudaError("router_topk: bad top_k " + std::to_string(p.top_k) + " of " + std::to_string(p.num_experts));
  const bool grouped = p.num_expert_group > 1 && p.num_expert_group > p.topk_group;
  if (grouped && (p.num_experts % p.num_expert_group != 0 || p.topk_group < 1))
    throw CudaError("router_topk: " + std::to_string(p.num_experts) + " experts in " +
                    std::to_string(p.num_expert_group) + " groups");
  const size_t smem =
      sizeof(float) * kWarpsPerBlock * (p.num_experts + (grouped ? p.num_expert_group : 0));  // K3: 14 KiB
  if (smem > 48 * 1024) throw CudaError("router_topk: " + std::to_string(p.num_experts) + " experts exceed shared memory");
  const int blocks = (n_tokens + kWarpsPerBlock - 1) / kWarpsPerBlock;
  router_topk_kernel<<<blocks, kWarpsPerBlock * 32, smem, stream>>>(logits, bias, n_tokens, p, expert_ids, weights);
  CUDA_CHECK_LAUNCH();
}

}  // namespace moonrun::cuda
