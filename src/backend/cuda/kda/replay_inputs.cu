// Speculative decoding's rollback inputs in one launch (Ops::kda_replay_inputs): for the
// replayed tokens of a batch, the short conv (+ SiLU) of the q, k, v projections a verify
// step saved, continuing each sequence's windows (advanced after), the l2 norm of q and k,
// and the saved g and beta rows gathered. The default path is 5 gathers, 3 convs (two
// kernels each with several tokens a sequence) and 2 norms: 13 tiny launches a KDA layer,
// which on the demo model was most of a verify step's extra cost.
//
// Bit for bit the unfused ops: the conv's taps as short_conv_kernel rounds them, SiLU as it
// writes it, the norm's sum in l2norm_rows_kernel's lane order and butterfly.
//
// grid (heads, sequences), 4 warps a block: warps 0..2 run q, k, v of one head for one
// sequence, token by token (each lane owns the head's channels lane, lane + 32, ...; those
// columns of the window are its alone, so it rolls them after its last token); warp 3
// gathers the head's g and beta rows.
#include <cuda_runtime.h>

#include <string>

#include "backend/cuda/common/cuda_check.h"
#include "backend/cuda/kda/kda_internal.cuh"
#include "backend/cuda/kda/kda_ops.h"

namespace moonrun::cuda {

namespace {

using kda_detail::warp_allreduce_sum;

constexpr int kMaxChannelsPerLane = 8;  // head_dim <= 256

__global__ void kda_replay_inputs_kernel(KdaReplayInputsArgs a) {
  const int h = blockIdx.x, lane = threadIdx.x % 32, which = threadIdx.x / 32;
  const BatchSeq seq = a.seqs[blockIdx.y];
  const int64_t D = a.dim;
  const int d = a.head_dim;
  if (which == 3) {
    for (int i = 0; i < seq.n_new; ++i) {
      const int64_t t = seq.token_start + i, src = a.rows[t];
      for (int c = lane; c < d; c += 32) a.out[3][t * D + h * d + c] = a.saved[3][src * D + h * d + c];
      if (lane == 0) a.out[4][t * a.num_heads + h] = a.saved[4][src * a.num_heads + h];
    }
    return;
  }
  const float* x = a.saved[which];
  const float* weight = a.conv[which];
  float* window = a.window[which] + seq.state_slot * a.slot_stride;
  const int K = a.kernel, past = K - 1;
  // input(r, col) of this sequence: its window's rows for r < 0, the saved rows otherwise.
  auto input = [&](int r, int64_t col) {
    return r < 0 ? window[static_cast<int64_t>(past + r) * D + col]
                 : x[static_cast<int64_t>(a.rows[seq.token_start + r]) * D + col];
  };
  const float scale = which == 0 ? a.q_scale : 1.0f;
  for (int i = 0; i < seq.n_new; ++i) {
    const int64_t t = seq.token_start + i;
    float y[kMaxChannelsPerLane];
    float ss = 0.0f;
#pragma unroll
    for (int j = 0; j < kMaxChannelsPerLane; ++j) {
      const int c = lane + 32 * j;
      if (c >= d) break;
      const int64_t col = static_cast<int64_t>(h) * d + c;
      const float* wc = weight + col * K;
      float acc = 0.0f;
      for (int tap = 0; tap < K; ++tap) acc = __fadd_rn(acc, __fmul_rn(wc[tap], input(i - past + tap, col)));
      y[j] = acc * (1.0f / (1.0f + expf(-acc)));
      ss = __fmaf_rn(y[j], y[j], ss);
    }
    float inv = 1.0f;
    if (which < 2) inv = scale / sqrtf(warp_allreduce_sum(ss) + 1e-6f);
#pragma unroll
    for (int j = 0; j < kMaxChannelsPerLane; ++j) {
      const int c = lane + 32 * j;
      if (c >= d) break;
      a.out[which][t * D + static_cast<int64_t>(h) * d + c] = which < 2 ? y[j] * inv : y[j];
    }
  }
  // The window becomes the last K-1 inputs. In place: row r takes input(n - past + r), a
  // saved row or window row n + r > r, never a row already overwritten.
  for (int c = lane; c < d; c += 32) {
    const int64_t col = static_cast<int64_t>(h) * d + c;
    for (int r = 0; r < past; ++r) window[static_cast<int64_t>(r) * D + col] = input(seq.n_new - past + r, col);
  }
}

}  // namespace

void kda_replay_inputs(const KdaReplayInputsArgs& args, int n_seqs, cudaStream_t stream) {
  if (n_seqs <= 0) return;
  if (args.head_dim < 1 || args.head_dim > 32 * kMaxChannelsPerLane)
    throw CudaError("kda_replay_inputs: head_dim " + std::to_string(args.head_dim) + " outside [1, 256]");
  if (args.kernel < 1) throw CudaError("kda_replay_inputs: conv kernel " + std::to_string(args.kernel));
  kda_replay_inputs_kernel<<<dim3(args.num_heads, n_seqs), 128, 0, stream>>>(args);
  CUDA_CHECK_LAUNCH();
}

}  // namespace moonrun::cuda
