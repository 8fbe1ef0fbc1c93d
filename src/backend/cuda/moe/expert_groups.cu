// Dispatch and combine for the routed experts (cpu::moe_forward's grouping, K3_SPEC.md §2):
// group_by_expert turns the router's [n_tokens, top_k] expert ids into per-expert slot
// lists without a host round trip (so a decode step can be graph-captured), and
// combine_experts sums each token's top_k expert outputs with their weights in k order.
// Neither uses atomics on values: the combine is a fixed-order sum, the grouping a stable
// counting sort, so the whole MoE block is bit-reproducible.
#include <cuda_runtime.h>

#include <string>

#include "backend/cuda/common/cuda_check.h"
#include "backend/cuda/common/overlap_launch.cuh"
#include "backend/cuda/moe/moe_ops.h"

namespace moonrun::cuda {

namespace {

constexpr unsigned kFullMask = 0xffffffffu;

// One block. Shared memory: count then cursor per expert [E], then per 32-expert chunk its
// slot total and its active-expert count [2 x chunks].
// 1. count slots per expert (shared-memory atomics on integers: the counts, not their
//    order, come out of it, so this is deterministic);
// 2. every warp scans its chunks' counts; warp 0 scans the chunk totals; every warp then
//    writes its chunks' offsets and active experts (one warp walking K3's 28 chunks in turn,
//    28 dependent shuffle scans, took ~4 us of a decode step's MoE layer);
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
  wait_for_previous_grid();  // the ids are the router's (common/overlap_launch.cuh)
  allow_next_grid();         // the gate/up blocks get resident and wait for the groups
  const int n_chunks = (num_experts + 31) / 32;
  int* chunk_slots = cursor + num_experts;  // [n_chunks]: slots, then (after 2) the first offset
  int* chunk_active = chunk_slots + n_chunks;  // [n_chunks]: active experts, then the first place
  for (int e = threadIdx.x; e < num_experts; e += blockDim.x) cursor[e] = 0;
  __syncthreads();
  for (int s = threadIdx.x; s < n_slots; s += blockDim.x) {
    const int e = local(s);
    if (e >= 0) atomicAdd(&cursor[e], 1);
  }
  __syncthreads();
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, n_warps = blockDim.x / 32;
  const unsigned lanes_below = (1u << lane) - 1u;
  // Lane's expert of chunk c: its count and the inclusive scan of the chunk's counts.
  auto chunk_scan = [&](int c, int& count, int& inclusive) {
    const int e = 32 * c + lane;
    count = e < num_experts ? cursor[e] : 0;
    inclusive = count;
    for (int off = 1; off < 32; off <<= 1) {
      const int v = __shfl_up_sync(kFullMask, inclusive, off);
      if (lane >= off) inclusive += v;
    }
  };
  for (int c = warp; c < n_chunks; c += n_warps) {
    int count, inclusive;
    chunk_scan(c, count, inclusive);
    const unsigned has = __ballot_sync(kFullMask, count > 0);
    if (lane == 31) {
      chunk_slots[c] = inclusive;
      chunk_active[c] = __popc(has);
    }
  }
  __syncthreads();
  if (warp == 0) {  // exclusive scans of the chunk totals, in place
    int running = 0, n_active = 0;
    for (int base = 0; base < n_chunks; base += 32) {
      const int c = base + lane;
      const int slots = c < n_chunks ? chunk_slots[c] : 0, active = c < n_chunks ? chunk_active[c] : 0;
      int inc_slots = slots, inc_active = active;
      for (int off = 1; off < 32; off <<= 1) {
        const int vs = __shfl_up_sync(kFullMask, inc_slots, off), va = __shfl_up_sync(kFullMask, inc_active, off);
        if (lane >= off) inc_slots += vs, inc_active += va;
      }
      if (c < n_chunks) {
        chunk_slots[c] = running + inc_slots - slots;
        chunk_active[c] = n_active + inc_active - active;
      }
      running += __shfl_sync(kFullMask, inc_slots, 31);
      n_active += __shfl_sync(kFullMask, inc_active, 31);
    }
    if (lane == 0) {
      g.offsets[num_experts] = running;
      *g.num_active = n_active;
    }
  }
  __syncthreads();
  for (int c = warp; c < n_chunks; c += n_warps) {
    int count, inclusive;
    chunk_scan(c, count, inclusive);
    const int e = 32 * c + lane, start = chunk_slots[c] + inclusive - count;
    const unsigned has = __ballot_sync(kFullMask, count > 0);
    if (e < num_experts) g.offsets[e] = start;
    if (count > 0) g.active[chunk_active[c] + __popc(has & lanes_below)] = e;
    if (e < num_experts) cursor[e] = start;  // only this lane read its count
  }
  __syncthreads();
  if (warp > 0) return;

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
// product and the sum rounded separately (no FMA contraction), as the CPU loop does. A slot
// whose expert another expert-parallel rank holds was never written: it adds 0, as on the
// CPU (whose slot rows start at zero), without a memset of the slot rows.
__global__ void combine_experts_kernel(const float* __restrict__ expert_out, const float* __restrict__ weights,
                                       const int32_t* __restrict__ ids, int first_expert, int num_experts, int top_k,
                                       int dim, float* __restrict__ y) {
  wait_for_previous_grid();  // the expert outputs (common/overlap_launch.cuh)
  const int t = blockIdx.x;
  const int c = blockIdx.y * blockDim.x + threadIdx.x;
  if (c >= dim) return;
  const float* w = weights + static_cast<size_t>(t) * top_k;
  const int32_t* id = ids + static_cast<size_t>(t) * top_k;
  auto held = [&](int k) {
    return static_cast<unsigned>(__ldg(id + k) - first_expert) < static_cast<unsigned>(num_experts);
  };
  const float* o = expert_out + static_cast<size_t>(t) * top_k * dim + c;
  // Eight outputs' loads issued before the first is added (one dependent load a k cost a
  // decode step's combine ~16 memory latencies).
  constexpr int kBatch = 8;
  float acc = 0.0f;
  int k = 0;
  for (; k + kBatch <= top_k; k += kBatch) {
    float v[kBatch], wk[kBatch];
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      v[j] = held(k + j) ? __ldg(o + static_cast<size_t>(k + j) * dim) : 0.0f;
      wk[j] = __ldg(w + k + j);
    }
#pragma unroll
    for (int j = 0; j < kBatch; ++j) acc = __fadd_rn(acc, __fmul_rn(v[j], wk[j]));
  }
  for (; k < top_k; ++k) acc = __fadd_rn(acc, __fmul_rn(held(k) ? o[static_cast<size_t>(k) * dim] : 0.0f, w[k]));
  y[static_cast<size_t>(t) * dim + c] = acc;
}

}  // namespace

void group_by_expert(const int32_t* ids, int n_slots, int first_expert, int num_experts, const ExpertGroups& groups,
                     cudaStream_t stream) {
  const size_t smem = sizeof(int) * (static_cast<size_t>(num_experts) + 2 * ((num_experts + 31) / 32));
  if (num_experts <= 0 || smem > 48 * 1024)
    throw CudaError("group_by_expert: " + std::to_string(num_experts) + " experts");
  launch_overlapping(group_by_expert_kernel, 1, 1024, smem, stream, ids, n_slots, first_expert, num_experts, groups);
}

void combine_experts(const float* expert_out, const float* weights, const int32_t* ids, int first_expert,
                     int num_experts, int n_tokens, int top_k, int dim, float* y, cudaStream_t stream) {
  if (n_tokens <= 0 || dim <= 0) return;
  constexpr int kThreads = 256;
  const dim3 grid(n_tokens, (dim + kThreads - 1) / kThreads);
  launch_overlapping(combine_experts_kernel, grid, kThreads, 0, stream, expert_out, weights, ids, first_expert,
                     num_experts, top_k, dim, y);
}

}  // namespace moonrun::cuda
