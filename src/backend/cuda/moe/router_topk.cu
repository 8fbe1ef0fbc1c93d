// The MoE router's choice on the GPU: the twin of cpu::route_token (backend/cpu/router.cpp,
// K3_SPEC.md §2 "MoE layer"). One warp per token, its scores in registers (and, for the
// group stage, in shared memory).
//
// Selection without sorting: the CPU orders experts by (biased score descending, id
// ascending) and takes the first top_k. Here each pick is one warp argmax in that total
// order over the experts not yet picked (each lane's own experts, a bit mask of which are
// left). The group stage (stable_sort of group scores, keep the first topk_group) takes the
// k-th group as the best one strictly after the (k-1)-th in the same order.
#include <cuda_runtime.h>

#include <climits>
#include <cmath>

#include "backend/cuda/common/cuda_check.h"
#include "backend/cuda/moe/moe_ops.h"

namespace moonrun::cuda {

namespace {

constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kWarpsPerBlock = 4;  // tokens per block
constexpr int kMaxPerLane = 32;    // experts a lane holds: up to 1024

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

  // Lane l's experts l, l + 32, ...: every logit and bias load in flight at once (a loop
  // that loads, computes and stores each in turn waits on memory 28 times at K3's 896), the
  // unbiased scores (the picks' weights) and the biased ones in registers.
  float sg[kMaxPerLane], v[kMaxPerLane];
#pragma unroll
  for (int j = 0; j < kMaxPerLane; ++j) {
    const int e = lane + 32 * j;
    sg[j] = e < E ? lg[e] : 0.0f;
    v[j] = e < E && bias ? bias[e] : 0.0f;
  }
#pragma unroll
  for (int j = 0; j < kMaxPerLane; ++j) {
    sg[j] = router_sigmoid(sg[j]);
    v[j] += sg[j];
    if (grouped && lane + 32 * j < E) choice[lane + 32 * j] = v[j];
  }
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

  // Top-k picks in order; every lane knows every pick, lane k%32 stores pick k. Lane l holds
  // experts l, l + 32, ... in registers with its best remaining one; a pick takes the warp's
  // best, and only the lane it came from looks at its experts again. (Scanning all E for
  // every pick cost 26 us a token at K3's 896 experts and top-16.)
  // The lane's best also carries its unbiased score (the pick's weight), so a pick loads
  // nothing from memory.
  uint32_t alive = 0;
#pragma unroll
  for (int j = 0; j < kMaxPerLane; ++j) {
    const int e = lane + 32 * j;
    if (e >= E) continue;
    alive |= 1u << j;
    if (grouped) v[j] = biased(e);
  }
  float mine_w = 0.0f;
  auto lane_best = [&] {
    Pick best{-INFINITY, INT_MAX};
#pragma unroll
    for (int j = 0; j < kMaxPerLane; ++j)  // ascending ids: the first of equal values wins
      if (((alive >> j) & 1u) && (v[j] > best.v || best.i == INT_MAX)) {
        best = Pick{v[j], lane + 32 * j};
        mine_w = sg[j];
      }
    return best;
  };
  Pick mine = lane_best();
  int32_t* ids = expert_ids + static_cast<size_t>(t) * p.top_k;
  float* wts = weights + static_cast<size_t>(t) * p.top_k;
  float sum = 0.0f;  // the CPU's sequential sum over picks
  for (int k = 0; k < p.top_k; ++k) {
    const Pick pick = warp_best(mine);
    const float w = __shfl_sync(kFullMask, mine_w, pick.i % 32);  // unbiased score
    if (pick.i % 32 == lane) {
      alive &= ~(1u << (pick.i / 32));
      mine = lane_best();
    }
    sum += w;
    if (lane == k % 32) {
      ids[k] = pick.i;
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
  if (p.num_experts > 32 * kMaxPerLane)
    throw CudaError("router_topk: " + std::to_string(p.num_experts) + " experts, more than " +
                    std::to_string(32 * kMaxPerLane));
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
