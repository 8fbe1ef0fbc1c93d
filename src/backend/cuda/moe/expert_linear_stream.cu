// The MXFP4 routed-expert GEMM at decode batch sizes (an expert gets at most 8 tokens): the
// same y[s, o] = sum_i x[s / x_row_div, i] * W_e[o, i] as expert_linear.cu's CUDA-core
// reference and expert_linear_mma.cu's register-fed kernel (which keeps larger batches).
// Dequantisation and the MMA slice: moe/mxfp4_rows.cuh.
//
// One block per 32 rows (two m16 tiles) of one active expert (grid: active experts bound x
// out / 32). The block's tile - 32 rows of in / 2 code bytes, contiguous in the stacked
// layout, and their 32 x in / 32 scales - comes into shared memory by bulk copies on one
// mbarrier, all but its last 8 x 64 columns (the tail): each warp reads its tail slice's
// codes from global memory itself once it is done with its copied slices. The
// gate and up projections run as one launch whose blocks take 16 rows of each and store
// act(gate, up) in bf16 for the down projection (SiTU fused: no fp32 products through
// memory, no elementwise kernel).
// Why whole tiles: a decode step streams each expert's codes once, and what limits that
// stream is how many bytes are in flight (~48 KB per multiprocessor at 4.2 TB/s). Chunked
// pipelines of per-row copies (128 to 256 bytes a row a stage) moved 1.9-2.1 TB/s even with
// the MMAs taken out (docs/performance.md); a ~50 KB copy a block, four blocks a
// multiprocessor, keeps ~200 KB in flight with a handful of copy instructions. The dequant-
// isation is integer work that, with the copies fixed, bounds the kernel (ncu: the ALU pipe
// at ~70 % with the checkpoint's code layout; the codes are now re-laid at load so that a
// pair costs one shift and one mask, mxfp4_pairs.h); two tiles a warp share each slice's x.
// Measured on the H200 (16 experts x 1 token, gate/up/down, whole tiles): 0.135 ms whole,
// 0.092 with the dequantisation and MMAs taken out, 0.112 with the copies taken out -
// compute-bound, with the copy and compute phases of a multiprocessor's blocks overlapping
// only in part: while a block waits for its tile its eight warps issue nothing. Why the
// tail: K3's whole gate/up tile (57 KB at latent 3584) let three blocks share a
// multiprocessor; without 8 KB of it, four do (the registers allow no more), so more warps
// have work while others wait. Which 8 KB, and when it is read, measured side by side
// (docs/performance.md, "2026-12-03 (third)"): the last slices, read after the copied ones,
// beat the first ones read during the wait (the "head", 06a5dfb) by 0.001-0.002 ms at 2
// tokens an expert and 0.005-0.006 at 8, and lose 0.001-0.002 at 1; asking for them while
// the copy is in flight (their registers held through the loop), an L2 prefetch of them
// with the copy, two slices a warp, and loads past L1 (L1::no_allocate) were each slower.
// The four kernels of the routed experts (grouping, gate/up, down, combine) are launched
// overlapping their predecessor (common/overlap_launch.cuh): the down launch's blocks copy
// their weight tiles while the gate/up launch's last wave finishes, and wait only before
// reading h. 16 experts x 1 / 8 tokens: 0.130 / 0.137 ms launched one after the other,
// 0.117 / 0.126 overlapped (same binary, same call, docs/performance.md).
// Tried earlier and slower: four k-chunk barriers a tile (448-byte copies: 0.165 ms) and a
// persistent kernel with two 16-row stages a block (x read once per 16 rows instead of 32:
// 0.148 ms).
//
// Wide inputs (K2's gate/up: 7168 at hidden 7168, a 32-row tile of 114 KB with its scales)
// take tiles of one m16 (16 rows, 57 KB): x is then shared by 16 rows instead of 32, and a
// gated block takes 8 rows of gate and 8 of up (tile rows g and g + 8), so each output's two
// sums still meet in one thread. Before, such shapes went to expert_linear_mma.cu's kernel,
// which reads each row's slices per warp without the whole-tile copies.
//
// The eight warps split the reduction: warp w takes the 64-wide slices w, w + 8, ... and the
// partial tiles are added in warp order, so the result is the same on every run. (Warp w's
// slices are its copied ones w, w + 8, ... and then its tail slice, copied slices + w: the
// same set as round-robin when the slices are a multiple of eight, as at K3's widths.) x stays in
// global memory (the L1/L2-resident activation rows every block of the expert reads); each
// thread's next slice of x is loaded while it works on the current one. Whether any scale
// needs the two-step multiply (mxfp4_rows.cuh) is decided once for the block, from the
// copied scales: all of them, the tail's too, come with the tile.
//
// INT4 (kInt4, Kind::int4_pairs: the words re-laid at load, int4_pairs.h): the same tiles
// and loads - a word of eight u4 is the size of four bytes of E2M1 codes, so rows, slices
// and bulk copies are the same bytes - with bf16 scales (two bytes a group, so a row's
// scales are in / 16 bytes) and x read at the k the re-laid words hold (k 8t .. 8t + 7 and
// 32 + 8t .. 32 + 8t + 7 of a slice). Each group's sums are scaled in fp32 after its MMAs
// (mxfp4_rows.cuh, int4::mma_int4_words); no two-step case.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdlib>
#include <string>

#include "backend/cuda/common/bulk_copy.cuh"
#include "backend/cuda/common/cuda_check.h"
#include "backend/cuda/common/mma.cuh"
#include "backend/cuda/common/overlap_launch.cuh"
#include "backend/cuda/dense/gated_act.cuh"
#include "backend/cuda/moe/moe_ops.h"
#include "backend/cuda/moe/mxfp4_rows.cuh"

namespace moonrun::cuda {

namespace {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
// m16 tiles per block (each warp works on all): two, or one where two tiles' rows would not
// fit in shared memory (inputs past ~6k: K2's gate/up at hidden 7168).
constexpr int kMaxTiles = 2;
constexpr int kMaxTokens = 8;    // per expert a pass: one n8 fragment
// Multi-pass blocks (on unless MOONRUN_EXPERT_MULTI_PASS=0): a step of up to this many tokens, each
// block running its expert's slots in passes of kMaxTokens over the one copied tile.
constexpr int kMaxMultiTokens = 256;
constexpr int kSlice = 64;       // k per warp per round: four k16 MMA steps
// Bytes after each code row in shared memory. 16 leaves the 64-bit reads two-way bank
// conflicted (ncu: 1.4 M of 3.7 M wavefronts); 32 and 48, conflict-free, measured slower or
// no faster (2026-12-03), so the smaller tile stays.
constexpr int kRowPad = 16;
constexpr int kBarrierBytes = 16;

// What the tile's shared memory and 64 registers a thread allow. Four blocks need the whole
// 228 KB for shared memory (allow_dynamic_smem's all_shared), which leaves L1 28 KB: x's
// rows, which every block of an expert reads, miss L1 more often than with three blocks;
// four are faster all the same (measured, docs/performance.md).
constexpr int kBlocksPerSm = 4;

// The last round of slices (one a warp) is read from global memory, not copied: see the top.
__host__ __device__ constexpr int tail_slices(int n_slices) { return n_slices < kWarps ? n_slices : kWarps; }
__host__ __device__ constexpr int copied_slices(int n_slices) { return n_slices - tail_slices(n_slices); }
__host__ __device__ constexpr int copied_code_bytes(int in) { return copied_slices(in / kSlice) * (kSlice / 2); }
// Scale bytes of one row: E8M0 one byte a group of 32, INT4's bf16 two.
__host__ __device__ constexpr int row_scale_bytes(int in, bool int4) { return int4 ? in / 16 : in / 32; }

// Shared memory of one block: [mbarrier][16 x tiles code rows: the copied slices, each row
// padded by kRowPad][16 x tiles x in / 32 scales], and afterwards, over the rows, warps 1..7's
// partial tiles.
constexpr size_t partial_bytes(int tiles) { return (kWarps - 1) * tiles * 4 * 32 * sizeof(float); }
// multi: the partial tiles after the tile, not over it (the tile serves every pass).
size_t tile_smem_bytes(int in, bool int4, int tiles, bool multi = false) {
  const size_t rows = 16 * static_cast<size_t>(tiles);
  const size_t tile = rows * (copied_code_bytes(in) + kRowPad) + rows * row_scale_bytes(in, int4);
  if (multi) return kBarrierBytes + tile + partial_bytes(tiles);
  return kBarrierBytes + (tile > partial_bytes(tiles) ? tile : partial_bytes(tiles));
}
constexpr size_t kMaxTileSmemBytes = 100 * 1024;
// Tiles a block of this shape takes: 2 where they fit, else 1 (else 0: not this kernel).
// MOONRUN_EXPERT_ONE_TILE=0 sends such shapes to expert_linear_mma.cu, as before 2026-12-07
// (one-tile blocks measured on an H100: K2's INT4 experts at 8 x 1 token 0.141 -> 0.103 ms,
// the K2.7 slice's b = 8 step 3.345 -> 3.158 ms; docs/performance.md).
int tiles_for(int in, bool int4, bool multi = false) {
  if (tile_smem_bytes(in, int4, kMaxTiles, multi) <= kMaxTileSmemBytes) return kMaxTiles;
  const char* v = std::getenv("MOONRUN_EXPERT_ONE_TILE");  // read at each call: the op tests set it
  if (v != nullptr && v[0] == '0') return 0;
  return tile_smem_bytes(in, int4, 1, multi) <= kMaxTileSmemBytes ? 1 : 0;
}

// Steps of 9 .. kMaxMultiTokens tokens in multi-pass blocks: on by default since measured
// (H100, 2026-12-07: K3 slice b = 32 / 128 0.56 / 0.52 -> 0.76 / 0.70 of the floor, K2.7
// 0.53 / 0.48 -> 0.68 / 0.61); MOONRUN_EXPERT_MULTI_PASS=0 sends them to expert_linear_mma.cu.
bool multi_pass_enabled() {
  const char* v = std::getenv("MOONRUN_EXPERT_MULTI_PASS");  // read at each call: the op tests set it
  return v == nullptr || v[0] != '0';
}
bool multi_for(int n_tokens) { return n_tokens > kMaxTokens; }

// x[16t .. 16t + 15] of slice sl of token row xr (MXFP4); INT4: x[8t .. 8t + 7] and
// x[32 + 8t .. 32 + 8t + 7], the k of thread t's re-laid words (int4_pairs.h).
template <bool kInt4>
__device__ __forceinline__ void load_x(const bf16* xr, int sl, int t, uint4 v[2]) {
  if constexpr (kInt4) {
    v[0] = __ldg(reinterpret_cast<const uint4*>(xr + sl * kSlice + 8 * t));
    v[1] = __ldg(reinterpret_cast<const uint4*>(xr + sl * kSlice + 32 + 8 * t));
  } else {
    const uint4* p = reinterpret_cast<const uint4*>(xr + sl * kSlice + 16 * t);
    v[0] = __ldg(p);
    v[1] = __ldg(p + 1);
  }
}

// The weights' kind in the kernels' templates: MXFP4 with the one- or two-step scale
// multiply, or re-laid INT4.
enum class Mode { mxfp4, mxfp4_two_step, int4 };

// One slice's MMAs for rows ra, rb of a tile: their code words ca, cb, and their scales from
// `scales` (rows of scale_bytes, in shared memory).
template <Mode kMode>
__device__ __forceinline__ void slice_mma(uint2 ca, uint2 cb, const uint8_t* scales, int scale_bytes, int ra, int rb,
                                          int sl, int t, const uint32_t xw[8], float acc[4]) {
  if constexpr (kMode == Mode::int4) {
    // Groups 2 sl and 2 sl + 1 of each row: one 32-bit word of two bf16 scales.
    const uint32_t sa = *reinterpret_cast<const uint32_t*>(scales + ra * scale_bytes + 4 * sl);
    const uint32_t sb = *reinterpret_cast<const uint32_t*>(scales + rb * scale_bytes + 4 * sl);
    int4::mma_int4_words(ca, cb, sa, sb, xw, acc);
  } else {
    // k 16t .. 16t + 15 of the slice lie in scale group 2 sl + t / 2.
    const uint32_t sa = scales[ra * scale_bytes + 2 * sl + t / 2];
    const uint32_t sb = scales[rb * scale_bytes + 2 * sl + t / 2];
    mxfp4::mma_mxfp4_codes<kMode == Mode::mxfp4_two_step>(ca, cb, sa, sb, xw, acc);
  }
}

// Warp w's copied slices w, w + kWarps, ... (< n_copied) of the tile in shared memory, into
// acc[m16 tile]. x_next holds the first one's x; each slice asks for the next one's, and the
// last for slice `then`'s (the warp's tail slice; -1: none). (Two slices ahead was measured
// too: no faster at 1-8 tokens.)
template <Mode kMode, int kTiles>
__device__ __forceinline__ void tile_slices(const uint8_t* codes, int stride, const uint8_t* scales, int scale_bytes,
                                            const bf16* xr, int n_copied, int then, int warp, int gid, int t,
                                            uint4 x_next[2], float acc[kTiles][4]) {
  for (int sl = warp; sl < n_copied; sl += kWarps) {
    const uint32_t xw[8] = {x_next[0].x, x_next[0].y, x_next[0].z, x_next[0].w,
                            x_next[1].x, x_next[1].y, x_next[1].z, x_next[1].w};
    const int next = sl + kWarps < n_copied ? sl + kWarps : then;
    if (next >= 0) load_x<kMode == Mode::int4>(xr, next, t, x_next);
#pragma unroll
    for (int tt = 0; tt < kTiles; ++tt) {
      const int ra = 16 * tt + gid, rb = ra + 8;
      // Thread t's codes: bytes 8t .. 8t + 7 of the slice's 32 in rows ra and rb.
      const uint2 ca = *reinterpret_cast<const uint2*>(codes + ra * stride + sl * (kSlice / 2) + 8 * t);
      const uint2 cb = *reinterpret_cast<const uint2*>(codes + rb * stride + sl * (kSlice / 2) + 8 * t);
      slice_mma<kMode>(ca, cb, scales, scale_bytes, ra, rb, sl, t, xw, acc[tt]);
    }
  }
}

// One matrix (y), or the gate and up projections of one shape over the same x and groups,
// stored as h = act(gate, up) in bf16 (kGated): the SiTU between the up and down projections
// applied as the sums are stored, so neither fp32 product goes through memory and the
// elementwise kernel goes. A gated block of two tiles takes 16 rows of each (tile 0 the
// gate's, tile 1 the up's rows of the same indices); of one tile, 8 of each (the tile's rows
// g the gate's, g + 8 the up's): either way both sums of an output are in the same thread.
struct Jobs {
  StackedExperts gate, up;  // up: kGated only
  float* y = nullptr;       // !kGated: [slots, out] fp32
  bf16* h = nullptr;        // kGated: [slots, out] bf16
  ActivationParams act;
};

// Multi-pass blocks keep the partial tiles beside the tile (~60 KB a block at K3's and K2's
// widths): three a multiprocessor, so the registers of three (at four's 64 they spilled).
template <bool kGated, bool kInt4, int kTiles, bool kMulti>
__global__ void __launch_bounds__(kThreads, kMulti ? 3 : kBlocksPerSm)
    grouped_mxfp4_tile_kernel(const bf16* __restrict__ x, int x_row_div, Jobs jobs, ExpertGroups g) {
  constexpr int kRows = 16 * kTiles;                   // tile rows a block
  constexpr int kHalf = kRows / 2;                     // kGated: rows of each matrix
  extern __shared__ uint4 smem[];
  __shared__ const bf16* x_rows[kMaxTokens];
  // Launched overlapping the kernel before it (common/overlap_launch.cuh). The gate/up launch
  // follows the grouping, so it waits first and only then lets the down launch start; the
  // down launch's groups are therefore complete, so it starts its tile's copies and then
  // waits for h.
  if constexpr (kGated) wait_for_previous_grid();
  allow_next_grid();
  // The groups are read past L1 (__ldcg): the down launch reads them before its wait, where
  // what the grouping kernel wrote is known to be in L2, not that this multiprocessor's L1
  // holds no line of the same scratch from an earlier layer. (Measured in a later call than
  // the plain loads, not side by side: 0.003-0.006 ms slower at 1-8 tokens. The gate/up launch
  // reads them after its wait and could use plain loads; not measured, docs/performance.md.)
  if (static_cast<int>(blockIdx.x) >= __ldcg(g.num_active)) return;  // uniform over the block
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, gid = lane / 4, t = lane % 4;
  const StackedExperts& m = jobs.gate;
  const int e = __ldcg(g.active + blockIdx.x);
  // Single pass: n_all <= kMaxTokens; kMulti: any number, in passes of kMaxTokens.
  const int begin = __ldcg(g.offsets + e), n_all = __ldcg(g.offsets + e + 1) - begin;
  const int in = m.in, out = m.out, code_bytes = in / 2, scale_bytes = row_scale_bytes(in, kInt4), n_slices = in / kSlice;
  const int n_copied = copied_slices(n_slices), copied = copied_code_bytes(in), stride = copied + kRowPad;
  const int tail = n_copied + warp;  // this warp's tail slice, when warp < tail_slices(n_slices)
  constexpr int kBlockRows = kGated ? kHalf : kRows;  // output rows of each matrix
  const int row0 = static_cast<int>(blockIdx.y) * kBlockRows;
  const int64_t row = static_cast<int64_t>(e) * out + row0;
  uint64_t* bar = reinterpret_cast<uint64_t*>(smem);
  uint8_t* codes = reinterpret_cast<uint8_t*>(smem) + kBarrierBytes;
  uint8_t* scales = codes + kRows * stride;
  if (tid == 0) mbar_init(bar, 1);
  if (tid < min(n_all, kMaxTokens)) x_rows[tid] = x + static_cast<int64_t>(__ldcg(g.perm + begin + tid) / x_row_div) * in;
  __syncthreads();
  // Row r (0 .. kRows - 1) of the block's tile: the gate's rows and then the up's (kGated), or
  // kRows rows of one matrix. (Pointers selected one by one: a parameter struct selected by lane is
  // copied to local memory.)
  auto tile_row = [&](int r, const uint8_t*& w, const uint8_t*& sc, int64_t& at) {
    if constexpr (kGated) {
      w = static_cast<const uint8_t*>(r < kHalf ? jobs.gate.w : jobs.up.w);
      sc = r < kHalf ? jobs.gate.scales : jobs.up.scales;
      at = row + r % kHalf;
    } else {
      w = static_cast<const uint8_t*>(m.w);
      sc = m.scales;
      at = row + r;
    }
  };
  if (warp == 0) {
    if (lane == 0) mbar_arrive_expect_tx(bar, static_cast<uint32_t>(kRows * (copied + scale_bytes)));
    __syncwarp();
    static_assert(kRows <= 32, "a lane a row");
    // Scales in pieces of rows contiguous in memory: 16 (8 for a gated tile's halves).
    constexpr int kScalePiece = kGated ? kHalf : 16;
    if (lane < kRows) {
      const uint8_t *w, *sc;
      int64_t at;
      tile_row(lane, w, sc, at);
      if (copied > 0) bulk_copy(codes + lane * stride, w + at * code_bytes, copied, bar);
      if (lane % kScalePiece == 0)
        bulk_copy(scales + lane * scale_bytes, sc + at * scale_bytes, kScalePiece * scale_bytes, bar);
    }
  }
  if constexpr (!kGated) wait_for_previous_grid();  // x is the previous kernel's h
  const bool has_tail = warp < tail_slices(n_slices);
  const int then = has_tail ? tail : -1;
  // kMulti: the partial tiles after the tile (the next pass reads the tile again).
  float* partial = reinterpret_cast<float*>(kMulti ? scales + kRows * scale_bytes : codes);  // [kWarps - 1][kTiles][4][32]
  bool two_step = false;
  for (int pass = 0; pass < n_all; pass += kMaxTokens) {
    const int n_slots = min(n_all - pass, kMaxTokens);
    if (pass > 0) {  // kMulti only: the pass's token rows (every thread is past the last pass)
      if (tid < n_slots) x_rows[tid] = x + static_cast<int64_t>(__ldcg(g.perm + begin + pass + tid) / x_row_div) * in;
      __syncthreads();
    }
    // A lane without a token reads token 0's x: its MMA column is never stored.
    const bf16* xr = x_rows[gid < n_slots ? gid : 0];
    float acc[kTiles][4] = {};
    uint4 x_next[2];
    if (warp < n_copied) load_x<kInt4>(xr, warp, t, x_next);
    else if (has_tail) load_x<kInt4>(xr, tail, t, x_next);
    if (pass == 0) {
      mbar_wait(bar, 0);
      // Scales past 128 (values beyond 12) take the two-multiply path, decided once for the tile.
      // Four scales a word: a byte is > 128 when its top bit is set and its low seven are not 0.
      // (INT4's bf16 scales are applied in fp32: no such case.)
      int big_scale = 0;
      if constexpr (!kInt4) {
        const uint32_t* scale_words = reinterpret_cast<const uint32_t*>(scales);
        for (int i = tid; i < kRows * scale_bytes / 4; i += kThreads) {
          const uint32_t w = scale_words[i];
          big_scale |= (w & ((w & 0x7F7F7F7Fu) + 0x7F7F7F7Fu) & 0x80808080u) != 0;
        }
      }
      two_step = __syncthreads_or(big_scale);
    }
    if constexpr (kInt4)
      tile_slices<Mode::int4, kTiles>(codes, stride, scales, scale_bytes, xr, n_copied, then, warp, gid, t, x_next, acc);
    else if (two_step)
      tile_slices<Mode::mxfp4_two_step, kTiles>(codes, stride, scales, scale_bytes, xr, n_copied, then, warp, gid, t,
                                                x_next, acc);
    else
      tile_slices<Mode::mxfp4, kTiles>(codes, stride, scales, scale_bytes, xr, n_copied, then, warp, gid, t, x_next, acc);
    // The tail: slice `tail`'s codes from global memory (its scales came with the tile).
    if (has_tail) {
      const uint32_t xw[8] = {x_next[0].x, x_next[0].y, x_next[0].z, x_next[0].w,
                              x_next[1].x, x_next[1].y, x_next[1].z, x_next[1].w};
      uint2 c[kTiles][2];
      uint32_t sc[kTiles][2];
#pragma unroll
      for (int tt = 0; tt < kTiles; ++tt)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          const int r = 16 * tt + gid + 8 * hh;
          const uint8_t *w, *unused;
          int64_t at;
          tile_row(r, w, unused, at);
          c[tt][hh] = __ldg(reinterpret_cast<const uint2*>(w + at * code_bytes + tail * (kSlice / 2) + 8 * t));
          if constexpr (kInt4) sc[tt][hh] = *reinterpret_cast<const uint32_t*>(scales + r * scale_bytes + 4 * tail);
          else sc[tt][hh] = scales[r * scale_bytes + 2 * tail + t / 2];
        }
      if constexpr (kInt4) {
#pragma unroll
        for (int tt = 0; tt < kTiles; ++tt) int4::mma_int4_words(c[tt][0], c[tt][1], sc[tt][0], sc[tt][1], xw, acc[tt]);
      } else if (two_step) {
#pragma unroll
        for (int tt = 0; tt < kTiles; ++tt)
          mxfp4::mma_mxfp4_codes<true>(c[tt][0], c[tt][1], sc[tt][0], sc[tt][1], xw, acc[tt]);
      } else {
#pragma unroll
        for (int tt = 0; tt < kTiles; ++tt)
          mxfp4::mma_mxfp4_codes<false>(c[tt][0], c[tt][1], sc[tt][0], sc[tt][1], xw, acc[tt]);
      }
    }
    if constexpr (!kMulti) __syncthreads();  // the tile is read: its rows take the partial sums
    if (warp > 0)
#pragma unroll
      for (int tt = 0; tt < kTiles; ++tt)
#pragma unroll
        for (int i = 0; i < 4; ++i) partial[(((warp - 1) * kTiles + tt) * 4 + i) * 32 + lane] = acc[tt][i];
    __syncthreads();
    if (warp == 0) {
#pragma unroll
      for (int tt = 0; tt < kTiles; ++tt)
#pragma unroll
        for (int i = 0; i < 4; ++i)
          for (int w = 0; w < kWarps - 1; ++w) acc[tt][i] += partial[((w * kTiles + tt) * 4 + i) * 32 + lane];
      // C fragment: rows gid / gid + 8 of a tile, tokens 2t / 2t + 1.
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int n = 2 * t + j;
        if (n >= n_slots) continue;
        const int64_t s = g.perm[begin + pass + n];
        if constexpr (kGated && kTiles == 2) {
          const int r = row0 + gid;
          jobs.h[s * out + r] = __float2bfloat16_rn(gated_act(acc[0][j], acc[1][j], jobs.act));
          jobs.h[s * out + r + 8] = __float2bfloat16_rn(gated_act(acc[0][2 + j], acc[1][2 + j], jobs.act));
        } else if constexpr (kGated) {  // one tile: row g the gate's, g + 8 the up's, of output row0 + g
          jobs.h[s * out + row0 + gid] = __float2bfloat16_rn(gated_act(acc[0][j], acc[0][2 + j], jobs.act));
        } else {
#pragma unroll
          for (int tt = 0; tt < kTiles; ++tt) {
            const int r = row0 + 16 * tt + gid;
            jobs.y[s * out + r] = acc[tt][j];
            jobs.y[s * out + r + 8] = acc[tt][2 + j];
          }
        }
      }
    }
    if constexpr (!kMulti) break;  // one pass (n_all <= kMaxTokens)
    __syncthreads();  // warp 0 has read the partials and every thread x_rows: the next pass may write them
  }
}

using TileKernel = void (*)(const bf16*, int, Jobs, ExpertGroups);

// The kernel of a launch: gated or not, INT4 or MXFP4, one or two tiles, one pass or several.
template <bool kGated>
TileKernel tile_kernel(bool int4, int tiles, bool multi) {
  if (tiles == 2) {
    if (int4) return multi ? grouped_mxfp4_tile_kernel<kGated, true, 2, true> : grouped_mxfp4_tile_kernel<kGated, true, 2, false>;
    return multi ? grouped_mxfp4_tile_kernel<kGated, false, 2, true> : grouped_mxfp4_tile_kernel<kGated, false, 2, false>;
  }
  if (int4) return multi ? grouped_mxfp4_tile_kernel<kGated, true, 1, true> : grouped_mxfp4_tile_kernel<kGated, true, 1, false>;
  return multi ? grouped_mxfp4_tile_kernel<kGated, false, 1, true> : grouped_mxfp4_tile_kernel<kGated, false, 1, false>;
}

}  // namespace

bool grouped_mxfp4_stream_supported(const StackedExperts& m, bool x_bf16, int n_tokens, const void* x) {
  // Alignment: bulk copies need 16-byte ends (rows of in / 2 bytes, tiles of 32 x in / 32
  // scales), x rows 16-byte loads. The tile has to fit in shared memory (one m16 tile: in <= ~24k).
  const bool int4 = m.kind == StackedExperts::Kind::int4_pairs;
  const bool multi = multi_for(n_tokens);
  const int tiles = tiles_for(m.in, int4, multi);
  const bool tokens_ok = n_tokens >= 1 && (n_tokens <= kMaxTokens || (multi_pass_enabled() && n_tokens <= kMaxMultiTokens));
  return x_bf16 && (m.kind == StackedExperts::Kind::mxfp4 || int4) && tokens_ok &&
         m.in % kSlice == 0 && tiles > 0 && m.out % (16 * tiles) == 0 &&
         reinterpret_cast<uintptr_t>(m.w) % 16 == 0 && reinterpret_cast<uintptr_t>(m.scales) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(x) % 16 == 0;
}

void grouped_mxfp4_stream(const bf16* x, int x_row_div, const StackedExperts& m, const ExpertGroups& groups,
                          int max_active, int n_tokens, float* y, cudaStream_t stream, bool overlap_previous) {
  Jobs jobs;
  jobs.gate = m;
  jobs.y = y;
  const bool int4 = m.kind == StackedExperts::Kind::int4_pairs;
  const bool multi = multi_for(n_tokens);
  const int tiles = tiles_for(m.in, int4, multi);
  const size_t smem = tile_smem_bytes(m.in, int4, tiles, multi);
  const TileKernel kernel = tile_kernel<false>(int4, tiles, multi);
  allow_dynamic_smem(kernel, smem, /*all_shared=*/true);  // kBlocksPerSm
  const dim3 grid(max_active, m.out / (16 * tiles));
  if (overlap_previous) {
    launch_overlapping(kernel, grid, kThreads, smem, stream, x, x_row_div, jobs, groups);
    return;
  }
  kernel<<<grid, kThreads, smem, stream>>>(x, x_row_div, jobs, groups);
  CUDA_CHECK_LAUNCH();
}

bool grouped_mxfp4_stream_gated_supported(const StackedExperts& gate, const StackedExperts& up, bool x_bf16,
                                          int n_tokens, const void* x) {
  return grouped_mxfp4_stream_supported(gate, x_bf16, n_tokens, x) &&
         grouped_mxfp4_stream_supported(up, x_bf16, n_tokens, x) && gate.out == up.out && gate.in == up.in &&
         gate.kind == up.kind;
}

void grouped_mxfp4_stream_gated(const bf16* x, int x_row_div, const StackedExperts& gate, const StackedExperts& up,
                                const ActivationParams& act, const ExpertGroups& groups, int max_active, int n_tokens,
                                bf16* h, cudaStream_t stream) {
  if (up.out != gate.out || up.in != gate.in || up.kind != gate.kind)
    throw CudaError("grouped_mxfp4_stream_gated: two shapes, [" + std::to_string(gate.out) + ", " +
                    std::to_string(gate.in) + "] and [" + std::to_string(up.out) + ", " + std::to_string(up.in) + "]");
  Jobs jobs;
  jobs.gate = gate;
  jobs.up = up;
  jobs.h = h;
  jobs.act = act;
  const bool int4 = gate.kind == StackedExperts::Kind::int4_pairs;
  const bool multi = multi_for(n_tokens);
  const int tiles = tiles_for(gate.in, int4, multi);
  const size_t smem = tile_smem_bytes(gate.in, int4, tiles, multi);
  const TileKernel kernel = tile_kernel<true>(int4, tiles, multi);
  allow_dynamic_smem(kernel, smem, /*all_shared=*/true);  // kBlocksPerSm
  // Output rows a block: 16 of each matrix with two tiles, 8 with one.
  launch_overlapping(kernel, dim3(max_active, gate.out / (8 * tiles)), kThreads, smem, stream, x, x_row_div, jobs,
                     groups);
}

}  // namespace moonrun::cuda
