// The sampler on the GPU: the twin of cpu::sample_row (backend/cpu/sample.cpp) after the
// edits (logit_edits.cu).
// One block per row; nothing is sorted and no scratch memory is needed:
//   - each stage's surviving logits are recomputed from the raw row and the thresholds of
//     the stages before it (max, the min_p threshold, the k-th value, the top-p cut);
//   - top-k and top-p are both "find the value where a weighted count from the top first
//     reaches a target": top-k weighs every token 1 (target k), top-p weighs it by its
//     probability (target top_p). A radix select over the float's order-preserving 32-bit
//     key finds it in four passes of 256-bucket histograms, one per warp so that shared
//     atomics contend only within a warp (counts: u32; probability mass: fp64, the CPU's
//     precision, whose shared atomics are compare-and-swap loops);
//   - the inverse-CDF draw runs in token-id order as a block prefix sum.
#include <climits>
#include <cmath>
#include <cstdint>

#include "backend/cuda/common/cuda_check.h"
#include "backend/cuda/dense/block_reduce.cuh"
#include "backend/cuda/sample/sample_ops.h"

namespace moonrun::cuda {
namespace {

constexpr int kSampleThreads = 512;  // 320 logits per thread at K3's vocab of 163840
constexpr int kWarps = kSampleThreads / 32;
constexpr int kBuckets = 256;        // 8 bits of the key per radix pass

// Order-preserving key: a > b as floats <=> key(a) > key(b) as unsigned (non-NaN). -0 is
// folded onto +0 so that equal floats have equal keys (the CPU compares floats).
__device__ __forceinline__ uint32_t order_key(float x) {
  uint32_t b = __float_as_uint(x);
  if ((b << 1) == 0) b = 0;
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
__device__ __forceinline__ float key_value(uint32_t k) {
  return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

template <typename T>
__device__ T block_min(T v, T* shared) {
  return -block_max<T>(-v, -INT_MAX, shared);
}

// Exclusive prefix sum over the block in thread order; shared: 32 slots.
template <typename T>
__device__ T block_exclusive_scan(T v, T* shared) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  T inclusive = v;
  for (int offset = 1; offset < 32; offset <<= 1) {
    const T n = __shfl_up_sync(kFullWarp, inclusive, offset);
    if (lane >= offset) inclusive += n;
  }
  T exclusive = __shfl_up_sync(kFullWarp, inclusive, 1);
  if (lane == 0) exclusive = T(0);
  __syncthreads();
  if (lane == 31) shared[warp] = inclusive;
  __syncthreads();
  if (warp == 0) {
    const T total = lane < static_cast<int>(blockDim.x >> 5) ? shared[lane] : T(0);
    T inc = total;
    for (int offset = 1; offset < 32; offset <<= 1) {
      const T n = __shfl_up_sync(kFullWarp, inc, offset);
      if (lane >= offset) inc += n;
    }
    T exc = __shfl_up_sync(kFullWarp, inc, 1);
    if (lane == 0) exc = T(0);
    shared[lane] = exc;  // each lane rewrites only the slot it read
  }
  __syncthreads();
  return shared[warp] + exclusive;
}

struct Selected {
  uint32_t key;  // the key where the weight from the top first reaches the target
  double above;  // the total weight of keys strictly above it
};

// Radix select from the top: the key K with W(key > K) < target <= W(key >= K), where W sums
// key_weight's weights. key_weight(i, &key, &w) -> false: token i takes no part. When the
// weights sum to less than target (rounding), it ends on the lowest key that has weight.
template <typename Weight, typename KeyWeight>
__device__ Selected radix_select_from_top(int vocab, double target, KeyWeight key_weight, Weight* hist,
                                          Selected* result) {
  // hist: [kWarps, kBuckets], each warp adds into its own row; row 0 then holds the total.
  Weight* warp_hist = hist + (threadIdx.x >> 5) * kBuckets;
  uint32_t prefix = 0, prefix_mask = 0;
  double above = 0;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int b = threadIdx.x; b < kWarps * kBuckets; b += blockDim.x) hist[b] = 0;
    __syncthreads();
    // Runs of one bucket are summed in a register first and added once: most keys share
    // their top byte, and with tied logits all bytes.
    int run_bucket = -1;
    Weight run_weight = 0;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
      uint32_t key;
      Weight w = 0;
      if (!key_weight(i, &key, &w) || (key & prefix_mask) != prefix) continue;
      const int bucket = static_cast<int>((key >> shift) & (kBuckets - 1));
      if (bucket != run_bucket) {
        if (run_bucket >= 0) atomicAdd(&warp_hist[run_bucket], run_weight);
        run_bucket = bucket;
        run_weight = 0;
      }
      run_weight += w;
    }
    if (run_bucket >= 0) atomicAdd(&warp_hist[run_bucket], run_weight);
    __syncthreads();
    // Fold the warps' rows into row 0, one bucket (column) per thread.
    for (int b = threadIdx.x; b < kBuckets; b += blockDim.x) {
      Weight total = 0;
      for (int w = 0; w < kWarps; ++w) total += hist[w * kBuckets + b];
      hist[b] = total;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      double cum = above, cum_at_lowest = above;
      int chosen = -1, lowest = 0;
      for (int b = kBuckets - 1; b >= 0; --b) {
        if (hist[b] == 0) continue;
        if (cum + hist[b] >= target) {
          chosen = b;
          break;
        }
        lowest = b;
        cum_at_lowest = cum;
        cum += hist[b];
      }
      if (chosen < 0) chosen = lowest, cum = cum_at_lowest;
      result->key = prefix | (static_cast<uint32_t>(chosen) << shift);
      result->above = cum;
    }
    __syncthreads();
    prefix = result->key;
    above = result->above;
    prefix_mask |= static_cast<uint32_t>(kBuckets - 1) << shift;
  }
  return Selected{prefix, above};
}

__global__ void sample_kernel(const float* __restrict__ logits, int vocab, const DeviceSamplingParams* params,
                              int32_t* __restrict__ out_ids) {
  __shared__ double reduce_d[32];
  __shared__ float reduce_f[32];
  __shared__ int reduce_i[32];
  // [kWarps, kBuckets] (32 KiB): the mass histograms; the count histograms reuse the bytes.
  __shared__ double hist[kWarps * kBuckets];
  __shared__ Selected selected;
  const float* row = logits + static_cast<int64_t>(blockIdx.x) * vocab;
  const DeviceSamplingParams p = params[blockIdx.x];
  const int tid = threadIdx.x;

  // Greedy: the argmax of the logits as given, lowest id on ties (std::max_element).
  if (p.temperature < 1e-5f) {
    float m = -INFINITY;
    for (int i = tid; i < vocab; i += blockDim.x) m = fmaxf(m, row[i]);
    m = block_max(m, -INFINITY, reduce_f);
    int first = INT_MAX;
    for (int i = tid; i < vocab && first == INT_MAX; i += blockDim.x)
      if (row[i] == m) first = i;
    first = block_min(first, reduce_i);
    if (tid == 0) out_ids[blockIdx.x] = first == INT_MAX ? 0 : first;
    return;
  }

  // x = logit / temperature (IEEE division, like the CPU's x /= temperature).
  const float temperature = p.temperature;
  auto scaled = [&](int i) { return row[i] / temperature; };
  float max_x = -INFINITY;
  for (int i = tid; i < vocab; i += blockDim.x) max_x = fmaxf(max_x, scaled(i));
  max_x = block_max(max_x, -INFINITY, reduce_f);
  if (max_x == -INFINITY) {  // nothing has mass: the CPU's draw falls back to id 0
    if (tid == 0) out_ids[blockIdx.x] = 0;
    return;
  }
  // The CPU's softmax numerator exp(x - max) in double; the max token survives every stage,
  // so this max is every stage's max.
  const double max_d = max_x;
  auto mass = [&](float x) { return x == -INFINITY ? 0.0 : exp(static_cast<double>(x) - max_d); };

  // min_p: drop p_i < min_p * p_max, with p = mass / sum and p_max = 1 / sum (exp(0) / sum).
  const bool use_min_p = p.min_p > 0.0f;
  double min_p_sum = 1.0, min_p_threshold = 0.0;
  if (use_min_p) {
    double s = 0;
    for (int i = tid; i < vocab; i += blockDim.x) s += mass(scaled(i));
    min_p_sum = block_sum(s, reduce_d);
    min_p_threshold = static_cast<double>(p.min_p) * (1.0 / min_p_sum);
  }
  auto after_min_p = [&](int i) {
    const float x = scaled(i);
    return use_min_p && mass(x) / min_p_sum < min_p_threshold ? -INFINITY : x;
  };

  // top-k: keep x >= the k-th largest value (masked tokens count, as -inf, like the CPU's
  // nth_element over the whole row).
  const bool use_top_k = p.top_k > 0 && p.top_k < vocab;
  float kth = -INFINITY;
  if (use_top_k) {
    const Selected s = radix_select_from_top(
        vocab, static_cast<double>(p.top_k),
        [&](int i, uint32_t* key, uint32_t* w) {
          *key = order_key(after_min_p(i));
          *w = 1;
          return true;
        },
        reinterpret_cast<uint32_t*>(hist), &selected);
    kth = key_value(s.key);
  }
  auto after_top_k = [&](int i) {
    const float x = after_min_p(i);
    return use_top_k && x < kth ? -INFINITY : x;
  };

  // top-p: in order of probability (ties: lower id first) a token stays iff the mass before
  // it is < top_p. The cut value v: mass(x > v) < top_p * sum <= mass(x >= v). Everything
  // above v stays; of the tokens equal to v (equal mass e_v each), the first n in id order
  // with above + j * e_v < target for j < n.
  const bool use_top_p = p.top_p < 1.0f;
  float cut = -INFINITY;
  int last_kept_tie = INT_MAX;  // the highest id among the kept tokens equal to cut
  if (use_top_p) {
    double s = 0;
    for (int i = tid; i < vocab; i += blockDim.x) s += mass(after_top_k(i));
    const double target = static_cast<double>(p.top_p) * block_sum(s, reduce_d);
    const Selected sel = radix_select_from_top(
        vocab, target,
        [&](int i, uint32_t* key, double* w) {
          const float x = after_top_k(i);
          if (x == -INFINITY) return false;
          *key = order_key(x);
          *w = mass(x);
          return true;
        },
        hist, &selected);
    cut = key_value(sel.key);
    const double e_cut = mass(cut);
    // Ties at the cut, counted per contiguous chunk so that their id order is the scan order.
    const int chunk = (vocab + blockDim.x - 1) / blockDim.x;
    const int begin = min(vocab, tid * chunk), end = min(vocab, begin + chunk);
    int my_ties = 0;
    for (int i = begin; i < end; ++i) my_ties += after_top_k(i) == cut;
    const int n_ties = block_sum(my_ties, reduce_i);
    // n_keep: the number of j in [0, n_ties) with above + j * e_cut < target (j = 0 always
    // is): the quotient, then corrected by the comparison itself, which is what decides.
    const double quotient = ceil((target - sel.above) / e_cut);
    int n_keep = static_cast<int>(fmin(fmax(quotient, 1.0), static_cast<double>(n_ties)));
    while (n_keep > 1 && !(sel.above + (n_keep - 1) * e_cut < target)) --n_keep;
    while (n_keep < n_ties && sel.above + n_keep * e_cut < target) ++n_keep;
    if (n_keep < n_ties) {
      const int before = block_exclusive_scan(my_ties, reduce_i);
      int found = INT_MAX;
      if (before < n_keep && n_keep <= before + my_ties) {
        int rank = before;
        for (int i = begin; i < end; ++i) {
          if (after_top_k(i) != cut) continue;
          if (++rank == n_keep) {
            found = i;
            break;
          }
        }
      }
      last_kept_tie = block_min(found, reduce_i);
    }
  }
  auto final_x = [&](int i) {
    const float x = after_top_k(i);
    if (use_top_p && (x < cut || (x == cut && i > last_kept_tie))) return -INFINITY;
    return x;
  };

  // The draw: the first id (in id order) whose cumulative mass exceeds u * total.
  const int chunk = (vocab + blockDim.x - 1) / blockDim.x;
  const int begin = min(vocab, tid * chunk), end = min(vocab, begin + chunk);
  double my_mass = 0;
  for (int i = begin; i < end; ++i) my_mass += mass(final_x(i));
  const double before = block_exclusive_scan(my_mass, reduce_d);
  const double total = block_sum(my_mass, reduce_d);
  const double u_mass = p.u * total;
  int chosen = INT_MAX, last_nonzero = -1;
  double cumulative = before;
  for (int i = begin; i < end; ++i) {
    const double e = mass(final_x(i));
    if (e <= 0.0) continue;
    last_nonzero = i;
    if (chosen == INT_MAX) {
      cumulative += e;
      if (u_mass < cumulative) chosen = i;
    }
  }
  chosen = block_min(chosen, reduce_i);
  last_nonzero = block_max(last_nonzero, -1, reduce_i);
  if (tid == 0) out_ids[blockIdx.x] = chosen != INT_MAX ? chosen : max(last_nonzero, 0);
}

}  // namespace

void sample_rows(const float* logits, int n_rows, int vocab, const DeviceSamplingParams* params, int32_t* out_ids,
                 cudaStream_t stream) {
  if (n_rows <= 0) return;
  if (vocab <= 0) throw CudaError("sample_rows: empty logits rows");
  sample_kernel<<<n_rows, kSampleThreads, 0, stream>>>(logits, vocab, params, out_ids);
  CUDA_CHECK_LAUNCH();
}

}  // namespace moonrun::cuda
