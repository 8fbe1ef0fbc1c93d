// Dispatch and combine for the routed experts (cpu::moe_forward's grouping, K3_SPEC.md §2):
// group_by_expert turns the router's [n_tokens, top_k] expert ids into per-expert slot
// lists without a host round trip (so a decode step can be graph-captured), and
// combine_experts sums each token's top_k expert outputs with their weights in k order.
// Neither uses atomics on values: the combine is a fixed-order sum, the grouping a stable
// counting sort, so the whole MoE block is bit-reproducible.
#include <cuda_runtime.h>

#include <string>

#include "backend/cuda/common/cuda_check.h"
#include "backend/cuda/moe/moe_ops.h"

namespace moonrun::cuda {

namespace {

constexpr unsigned kFullMask = 0xffffffffu;

// One block. Shared memory: count then cursor per expert [E].
// 1. count slots per expert (shared-memory atomics on integers: the counts, not their
//    order, come out of it, so this is deterministic);
// 2. warp 0 scans the counts into offsets and lists the active experts;
// 3. warp 0 places the slots in slot order, 32 at a time: lanes naming the same expert
//    (__match_any_sync) take consecutive places by lane rank, so each expert's list is
//    ascending in slot id (a stable sort).
__global__ void group_by_expert_kernel(const int32_t* __restrict__ ids, int n_slots, int first_expert,
                                       int num_experts, ExpertGroups g) {
  // An expert-parallel rank holds experts [first_expert, first_expert + num_experts): a
  // slot that chose another rank's expert is left out (-1).
  auto local = [&](int s) {
    const int e = ids[s] - first_expert;
    return e >= 0 && e < num_experts ? e : -1;
  };
  extern __shared__ int cursor[];  // [E]
  for (int e = threadIdx.x; e < num_experts; e += blockDim.x) cursor[e] = 0;
  __syncthreads();
  for (int s = threadIdx.x; s < n_slots; s += blockDim.x) {
    const int e = local(s);
    if (e >= 0) atomicAdd(&cursor[e], 1);
  }
  __syncthreads();
  if (threadIdx.x >= 32) return;
  const int lane = threadIdx.x;
  const unsigned lanes_below = (1u << lane) - 1u;

  int running = 0, n_active = 0;
  for (int base = 0; base < num_experts; base += 32) {
    const int e = base + lane;
    const int count = e < num_experts ? cursor[e] : 0;
    int inclusive = count;  // warp inclusive scan of the counts
    for (int off = 1; off < 32; off <<= 1) {
      const int v = __shfl_up_sync(kFullMask, inclusive, off);
      if (lane >= off) inclusive += v;
    }
    const int start = running + inclusive - count;
    if (e < num_experts) {
      g.offsets[e] = start;
      cursor[e] = start;  // this lane's own entry: read above, rewritten here
    }
    const unsigned has = __ballot_sync(kFullMask, count > 0);
    if (count > 0) g.active[n_active + __popc(has & lanes_below)] = e;
    n_active += __popc(has);
    running += __shfl_sync(kFullMask, inclusive, 31);
  }
  if (lane == 0) {
    g.offsets[num_experts] = running;
    *g.num_active = n_active;
  }
  __syncwarp();

  for (int base = 0; base < n_slots; base += 32) {
    const int s = base + lane;
    const int e = s < n_slots ? local(s) : -1;
    const unsigned peers = __match_any_sync(kFullMask, e);
    int place = 0;
    if (e >= 0) place = cursor[e] + __popc(peers & lanes_below);
    __syncwarp();  // every peer has read cursor[e] before the highest one advances it
    if (e >= 0) {
      g.perm[place] = s;
      if (lane == 31 - __clz(peers)) cursor[e] += __popc(peers);
    }
    __syncwarp();
  }
}

// grid (n_tokens, dim blocks): y[t, c] = sum_k w[t, k] * out[t*K + k, c], k ascending; the
// product and the sum rounded separately (no FMA contraction), as the CPU loop does.
__global__ void combine_experts_kernel(const float* __restrict__ expert_out, const float* __restrict__ weights,
                                       int top_k, int dim, float* __restrict__ y) {
  const int t = blockIdx.x;
  const int c = blockIdx.y * blockDim.x + threadIdx.x;
  if (c >= dim) return;
  const float* w = weights + static_cast<size_t>(t) * top_k;
  const float* o = expert_out + static_cast<size_t>(t) * top_k * dim + c;
  float acc = 0.0f;
  for (int k = 0; k < top_k; ++k) acc = __fadd_rn(acc, __fmul_rn(o[static_cast<size_t>(k) * dim], w[k]));
  y[static_cast<size_t>(t) * dim + c] = acc;
}

}  // namespace

void group_by_expert(const int32_t* ids, int n_slots, int first_expert, int num_experts, const ExpertGroups& groups,
                     cudaStream_t stream) {
  const size_t smem = sizeof(int) * static_cast<size_t>(num_experts);
  if (num_experts <= 0 || smem > 48 * 1024)
    throw CudaError("group_by_expert: " + std::to_string(num_experts) + " experts");
  group_by_expert_kernel<<<1, 1024, smem, stream>>>(ids, n_slots, first_expert, num_experts, groups);
  CUDA_CHECK_LAUNCH();
}

void combine_experts(const float* expert_out, const float* weights, int n_tokens, int top_k, int dim, float* y,
                     cudaStream_t stream) {
  if (n_tokens <= 0 || dim <= 0) return;
  constexpr int kThreads = 256;
  const dim3 grid(n_tokens, (dim + kThreads - 1) / kThreads);
  combine_experts_kernel<<<grid, kThreads, 0, stream>>>(expert_out, weights, top_k, dim, y);
  CUDA_CHECK_LAUNCH();
}

}  // namespace moonrun::cuda
