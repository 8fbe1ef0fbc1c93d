// KDA on the GPU (kernels/cuda/kda) against its CPU twins (kernels/cpu/kda.h): the short
// conv, the recurrence in both evaluation orders, and the whole layer, on random inputs of
// a tiny, a medium and K3's real shape (96 heads x 128, hidden 7168), plus bit-exact cases.
//
// Thresholds (normalised error, op_test_util.h):
// - fp32 pieces: the GPU sums in other orders (warp trees, per-warp partials) than the CPU's
//   sequential loops; a dot of d <= 128 terms then differs by a few ulp of its largest
//   term (~1e-7 relative), and the recurrence does not amplify it (each step multiplies S
//   by Diag(exp(g)) (I - beta k k^T) with exp(g) <= 1, |k| = 1, 0 < beta < 1: norm <= 1).
//   1e-5 leaves two orders of margin yet catches any wrong index or missing term (those
//   give errors of order 1).
// - The layer with bf16 x and bf16 weights (the CPU reference gets the same rounded values):
//   see LayerTolerance below.
#include "backend/cuda/kda/kda_layer.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "backend/cpu/kda.h"
#include "backend/cuda/common/cuda_check.h"
#include "op_test_util.h"

namespace moonrun {
namespace {

using optest::bf16_rounded;
using optest::expect_close;
using optest::expect_exact;
using optest::normalised_error;
using optest::random_small_ints;
using optest::random_uniform;

std::string shape_str(int T, int H, int d, const std::string& extra = "") {
  return "T" + std::to_string(T) + "xH" + std::to_string(H) + "xd" + std::to_string(d) + extra;
}

std::vector<float> download(const float* p, size_t n) {
  std::vector<float> h(n);
  if (n) CUDA_CHECK(cudaMemcpy(h.data(), p, n * sizeof(float), cudaMemcpyDeviceToHost));
  return h;
}

// ---------------------------------------------------------------------------------------
// The short conv.

// Integer inputs, windows and weights: every product and partial sum is an exact small
// integer, so the conv before SiLU must equal the integer sum bit for bit, and the rolled
// window is a copy (exact). The SiLU output then differs from the CPU only by expf's ulps.
void check_conv(int T, int dim, int K, bool integers, uint64_t seed) {
  using optest::random_normal;
  const std::vector<float> x = integers ? random_small_ints(size_t(T) * dim, seed, -3, 3)
                                        : random_normal(size_t(T) * dim, seed);
  const std::vector<float> w = integers ? random_small_ints(size_t(dim) * K, seed + 1, -2, 2)
                                        : random_uniform(size_t(dim) * K, seed + 1, -0.8f, 0.8f);
  const std::vector<float> win0 = integers ? random_small_ints(size_t(K - 1) * dim, seed + 2, -3, 3)
                                           : random_normal(size_t(K - 1) * dim, seed + 2);
  // CPU reference (also rolls its own copy of the window).
  std::vector<float> win_cpu = win0, y_cpu(x.size());
  cpu::short_conv_silu(x.data(), T, dim, w.data(), K, win_cpu.data(), y_cpu.data());

  cuda::DeviceBuffer<float> dx(x), dw(w), dwin(win0), dy(x.size());
  cuda::short_conv_silu(dx.data(), T, dim, dw.data(), K, dwin.data(), dy.data(), nullptr);
  CUDA_CHECK(cudaDeviceSynchronize());
  const std::string shape = shape_str(T, 1, dim, integers ? "_int" : "_normal");
  // SiLU = a / (1 + e^-a) with expf within 2 ulp on the GPU (CUDA C guide): ~5e-7 relative.
  expect_close("short_conv_silu", shape, normalised_error(dy.download(), y_cpu), 1e-6);
  expect_exact("short_conv_window", shape, dwin.download(), win_cpu);

  if (integers) {
    // The conv alone, against the integer sum over the timeline [window; x].
    std::vector<float> want(x.size());
    for (int t = 0; t < T; ++t)
      for (int c = 0; c < dim; ++c) {
        double acc = 0;
        for (int j = 0; j < K; ++j) {
          const int s = t - (K - 1) + j;
          acc += w[size_t(c) * K + j] * (s < 0 ? win0[size_t(K - 1 + s) * dim + c] : x[size_t(s) * dim + c]);
        }
        want[size_t(t) * dim + c] = static_cast<float>(acc);
      }
    dwin.upload(win0);
    cuda::short_conv(dx.data(), T, dim, dw.data(), K, dwin.data(), /*apply_silu=*/false, dy.data(), nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
    expect_exact("short_conv_nosilu", shape, dy.download(), want);
  }
}

TEST(KdaShortConv, IntegersBitExact) {
  REQUIRE_GPU();
  for (int T : {1, 2, 3, 7, 130}) check_conv(T, 64, 4, true, 10 + T);
  for (int T : {1, 5}) check_conv(T, 96 * 128, 4, true, 20 + T);  // K3: H*d channels
}

TEST(KdaShortConv, RandomAgainstCpu) {
  REQUIRE_GPU();
  for (int T : {1, 2, 3, 7, 130}) check_conv(T, 64, 4, false, 30 + T);
  for (int T : {1, 130}) check_conv(T, 96 * 128, 4, false, 40 + T);
  check_conv(9, 48, 2, false, 50);  // another kernel size
}

// A sequence fed in pieces shorter and longer than the window carries it exactly as the CPU.
TEST(KdaShortConv, PiecesCarryTheWindow) {
  REQUIRE_GPU();
  const int dim = 256, K = 4;
  const std::vector<float> w = random_uniform(size_t(dim) * K, 61, -0.8f, 0.8f);
  std::vector<float> win_cpu(size_t(K - 1) * dim, 0.0f);
  cuda::DeviceBuffer<float> dw(w), dwin(win_cpu);
  int piece_seed = 62;
  for (int T : {1, 2, 1, 9, 1}) {
    const std::vector<float> x = optest::random_normal(size_t(T) * dim, piece_seed++);
    std::vector<float> y_cpu(x.size());
    cpu::short_conv_silu(x.data(), T, dim, w.data(), K, win_cpu.data(), y_cpu.data());
    cuda::DeviceBuffer<float> dx(x), dy(x.size());
    cuda::short_conv_silu(dx.data(), T, dim, dw.data(), K, dwin.data(), dy.data(), nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
    expect_close("short_conv_silu_piece", shape_str(T, 1, dim), normalised_error(dy.download(), y_cpu), 1e-6);
    expect_exact("short_conv_window_piece", shape_str(T, 1, dim), dwin.download(), win_cpu);
  }
}

// ---------------------------------------------------------------------------------------
// The recurrence: token by token and chunked, against the CPU and against each other.

struct RecInputs {
  std::vector<float> q, k, v, g, beta, S0;
};

// As the layer feeds the recurrence: q, k L2-normalised per head (q times d^-1/2), v of
// order one, log decays g in [g_lo, 0], beta in (0, 1), and a non-zero incoming state.
RecInputs make_rec_inputs(int T, int H, int d, float g_lo, uint64_t seed) {
  RecInputs in;
  const size_t n = size_t(T) * H * d;
  in.q = random_uniform(n, seed, -1, 1);
  in.k = random_uniform(n, seed + 1, -1, 1);
  in.v = random_uniform(n, seed + 2, -1, 1);
  in.g = random_uniform(n, seed + 3, g_lo, 0);
  in.beta = random_uniform(size_t(T) * H, seed + 4, 0, 1);
  in.S0 = random_uniform(size_t(H) * d * d, seed + 5, -1, 1);
  for (size_t r = 0; r < size_t(T) * H; ++r) {
    double sq = 0, sk = 0;
    for (int i = 0; i < d; ++i) sq += double(in.q[r * d + i]) * in.q[r * d + i], sk += double(in.k[r * d + i]) * in.k[r * d + i];
    for (int i = 0; i < d; ++i) in.q[r * d + i] /= std::sqrt(sq * d), in.k[r * d + i] /= std::sqrt(sk);
  }
  return in;
}

struct RecResult {
  std::vector<float> o, S;
};

enum class Order { kRecurrent, kChunked };

RecResult run_gpu(const RecInputs& in, int T, int H, int d, Order order, int chunk = 64) {
  cuda::DeviceBuffer<float> q(in.q), k(in.k), v(in.v), g(in.g), beta(in.beta), S(in.S0), o(in.q.size());
  if (order == Order::kRecurrent)
    cuda::kda_recurrent(q.data(), k.data(), v.data(), g.data(), beta.data(), T, H, d, S.data(), o.data(), nullptr);
  else
    cuda::kda_chunked(q.data(), k.data(), v.data(), g.data(), beta.data(), T, H, d, S.data(), o.data(), nullptr,
                      chunk);
  CUDA_CHECK(cudaDeviceSynchronize());
  return {o.download(), S.download()};
}

RecResult run_cpu(const RecInputs& in, int T, int H, int d, Order order, int chunk = 64) {
  RecResult r{std::vector<float>(in.q.size()), in.S0};
  if (order == Order::kRecurrent)
    cpu::kda_recurrent(in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.beta.data(), T, H, d, r.S.data(),
                       r.o.data());
  else
    cpu::kda_chunked(in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.beta.data(), T, H, d, r.S.data(),
                     r.o.data(), chunk);
  return r;
}

// g_lo: -1 (moderate), -5 (K3's safe-gate bound: -320 over a chunk, most pair exponentials
// underflow), -0.01 (long memory: S accumulates ~100 tokens), -40 (softplus gates are unbounded).
void check_recurrence(int T, int H, int d, float g_lo, uint64_t seed, int chunk = 64) {
  const RecInputs in = make_rec_inputs(T, H, d, g_lo, seed);
  char tag[32];
  std::snprintf(tag, sizeof tag, "_g%g", g_lo);
  const std::string shape = shape_str(T, H, d, tag + (chunk != 64 ? "_C" + std::to_string(chunk) : ""));
  const RecResult rec = run_gpu(in, T, H, d, Order::kRecurrent);
  const RecResult chk = run_gpu(in, T, H, d, Order::kChunked, chunk);
  const RecResult rec_cpu = run_cpu(in, T, H, d, Order::kRecurrent);
  const RecResult chk_cpu = run_cpu(in, T, H, d, Order::kChunked, chunk);
  expect_close("kda_recurrent_o", shape, normalised_error(rec.o, rec_cpu.o), 1e-5);
  expect_close("kda_recurrent_S", shape, normalised_error(rec.S, rec_cpu.S), 1e-5);
  expect_close("kda_chunked_o", shape, normalised_error(chk.o, chk_cpu.o), 1e-5);
  expect_close("kda_chunked_S", shape, normalised_error(chk.S, chk_cpu.S), 1e-5);
  // The two orders are different arithmetic (the chunked one inverts a unit-triangular
  // [C, C] system): the CPU's own test allows 2e-5 between them; so do we.
  expect_close("kda_chunked_vs_recurrent_o", shape, normalised_error(chk.o, rec.o), 2e-5);
  expect_close("kda_chunked_vs_recurrent_S", shape, normalised_error(chk.S, rec.S), 2e-5);
}

TEST(KdaRecurrence, Tiny) {
  REQUIRE_GPU();
  for (int T : {1, 7, 64, 75, 130}) check_recurrence(T, 2, 32, -1.0f, 100 + T);
  check_recurrence(130, 2, 32, -5.0f, 200);
  check_recurrence(130, 2, 32, -0.01f, 201);
  check_recurrence(70, 2, 32, -40.0f, 202);
  check_recurrence(50, 2, 32, -1.0f, 203, /*chunk=*/16);
  // More than one pass of chunks (16 x 64 tokens per pass).
  check_recurrence(1100, 2, 32, -1.0f, 204);
}

TEST(KdaRecurrence, Medium) {
  REQUIRE_GPU();
  for (int T : {1, 7, 64, 75, 130}) check_recurrence(T, 4, 64, -1.0f, 300 + T);
  check_recurrence(75, 3, 48, -5.0f, 400);  // head_dim not a multiple of 32
}

TEST(KdaRecurrence, K3Shape) {
  REQUIRE_GPU();
  for (int T : {1, 7, 64, 75, 130}) check_recurrence(T, 96, 128, -5.0f, 500 + T);
  check_recurrence(130, 96, 128, -0.01f, 600);
}

// ---------------------------------------------------------------------------------------
// The whole layer: cuda::kda_forward against cpu::kda_forward, x and the projection
// weights bf16 on both sides (the CPU gets the rounded values).

// splitmix64 uniforms: K3's projections are 5 x 88M weights; std::mt19937 would take seconds.
std::vector<float> fast_uniform(size_t n, uint64_t seed, float scale) {
  std::vector<float> x(n);
  uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
  for (auto& v : x) {
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    v = cuda::round_bf16(scale * (static_cast<float>(z >> 40) * 0x1.0p-23f - 1.0f));  // [-scale, scale)
  }
  return x;
}

cpu::Linear bf16_linear(int out, int in, uint64_t seed, float gain = 1.0f) {
  // Uniform with variance gain^2 / in: projections of unit-variance inputs are O(gain).
  cpu::Linear l{fast_uniform(size_t(out) * in, seed, gain * std::sqrt(3.0f / in)), out, in};
  return l;
}

// A low-rank projection whose outputs are exact in bf16 for integer inputs: each row has
// 4 non-zeros of magnitude k/8 (k = 1..4), so with |x| <= 2 an output is m/8 with |m| <= 32
// (6 significant bits; bf16 holds 8). Then the GPU's bf16 rounding of the f_a / g_a activations (the
// inputs of f_b / g_b) is exact, and the layer test sees only the kernels' own arithmetic.
cpu::Linear sparse_exact_linear(int out, int in, uint64_t seed) {
  cpu::Linear l{std::vector<float>(size_t(out) * in, 0.0f), out, in};
  std::mt19937_64 gen(seed);
  for (int o = 0; o < out; ++o)
    for (int n = 0; n < 4; ++n) {
      const int col = static_cast<int>(gen() % in);
      l.w[size_t(o) * in + col] = (gen() % 2 ? 1.0f : -1.0f) * static_cast<float>(1 + gen() % 4) / 8.0f;
    }
  return l;
}

struct LayerCase {
  int hidden, H, d;
  bool k3_gate;      // K3: safe gate (lower bound -5) and full-rank output gate; else Kimi Linear
  bool exact_low;    // low-rank f_a / g_a outputs exact in bf16 (integer x, sparse weights)
  std::string name() const {
    return "h" + std::to_string(hidden) + "xH" + std::to_string(H) + "xd" + std::to_string(d) +
           (k3_gate ? "_k3gate" : "_softplus_lowrank") + (exact_low ? "" : "_denselow");
  }
};

struct Layer {
  cpu::KdaDims dims;
  cpu::KdaWeights w;
};

Layer make_layer(const LayerCase& lc, uint64_t seed) {
  Layer L;
  L.dims.hidden = lc.hidden;
  L.dims.num_heads = lc.H;
  L.dims.head_dim = lc.d;
  L.dims.conv_kernel = 4;
  L.dims.norm_eps = 1e-5f;
  L.dims.gate_lower_bound = lc.k3_gate ? -5.0f : std::numeric_limits<float>::quiet_NaN();
  const int D = lc.H * lc.d, hidden = lc.hidden;
  // Integer x in [-2, 2] has variance 2; the gain keeps the projections O(1) either way.
  const float xgain = lc.exact_low ? std::sqrt(0.5f) : 1.0f;
  cpu::KdaWeights& w = L.w;
  w.q_proj = bf16_linear(D, hidden, seed + 1, xgain);
  w.k_proj = bf16_linear(D, hidden, seed + 2, xgain);
  w.v_proj = bf16_linear(D, hidden, seed + 3, xgain);
  w.q_conv = random_uniform(size_t(D) * 4, seed + 4, -0.8f, 0.8f);
  w.k_conv = random_uniform(size_t(D) * 4, seed + 5, -0.8f, 0.8f);
  w.v_conv = random_uniform(size_t(D) * 4, seed + 6, -0.8f, 0.8f);
  w.A_log = random_uniform(lc.H, seed + 7, 0.0f, std::log(16.0f));  // A in [1, 16] as the reference's init
  w.dt_bias = random_uniform(D, seed + 8, -1.0f, 1.0f);
  w.f_a_proj = lc.exact_low ? sparse_exact_linear(lc.d, hidden, seed + 9) : bf16_linear(lc.d, hidden, seed + 9);
  w.f_b_proj = bf16_linear(D, lc.d, seed + 10);
  w.b_proj = bf16_linear(lc.H, hidden, seed + 11, 2.0f * xgain);
  if (lc.k3_gate) {
    w.g_proj = bf16_linear(D, hidden, seed + 12, 2.0f * xgain);
  } else {
    w.g_a_proj = lc.exact_low ? sparse_exact_linear(lc.d, hidden, seed + 13) : bf16_linear(lc.d, hidden, seed + 13);
    w.g_b_proj = bf16_linear(D, lc.d, seed + 14, 2.0f);
  }
  w.o_norm = random_uniform(lc.d, seed + 15, 0.5f, 1.5f);
  w.o_proj = bf16_linear(hidden, D, seed + 16);
  return L;
}

size_t weight_bytes(const cpu::KdaWeights& w) {
  size_t n = 0;
  for (const cpu::Linear* l : {&w.q_proj, &w.k_proj, &w.v_proj, &w.f_a_proj, &w.f_b_proj, &w.b_proj, &w.g_proj,
                               &w.g_a_proj, &w.g_b_proj, &w.o_proj})
    n += l->w.size() * sizeof(cuda::bf16) + 256;
  for (const std::vector<float>* v : {&w.q_conv, &w.k_conv, &w.v_conv, &w.A_log, &w.dt_bias, &w.o_norm})
    n += v->size() * sizeof(float) + 256;
  return n;
}

// Thresholds for the layer (normalised error; measured on the H200 in brackets):
// - The conv windows hold the q/k/v projections: the same bf16 products summed in fp32 in
//   another order (cuBLAS vs the CPU's dot): ~1e-7 relative [0 to 2.4e-7]; 1e-5.
// - S: after the projections everything is fp32 on both sides, as in the pieces; S is
//   reached through exp(g), whose slope in raw is up to |lb| a / 4 = 20 (K3 gate, A <= 16),
//   so raw's ~1e-7 summation-order difference may show as ~2e-6 [5e-8 to 7e-7]; 2e-5.
// - out: o_proj reads the gated o rounded to bf16, as the bf16 model stores it (the CPU keeps
//   fp32). bf16 rounds to 8 significant bits: a relative error of up to 2^-8 per element,
//   ~1.6e-3 rms. Over D terms with independent rounding signs out's error is that rms times
//   out's own scale [1.3e-3 to 2.2e-3]; 5e-3 (a wrong element, head or gate gives O(1)).
// - With dense f_a / g_a (exact_low false) the low-rank activations are rounded to bf16 too
//   (~1.6e-3 relative in raw, times the gate's slope of up to 20 in g): S and out then move by
//   up to ~1e-2 [6e-4 to 5.6e-3]; 2e-2. This case measures the model's own rounding.
struct LayerTolerance {
  double window = 1e-5, S = 2e-5, out = 5e-3;
};
LayerTolerance tolerance(const LayerCase& lc) {
  LayerTolerance t;
  if (!lc.exact_low) t.S = 2e-2, t.out = 2e-2;
  return t;
}

// Runs the layer over a sequence of calls (n_tokens, mode), both sides carrying their state,
// and compares every call's out and the state after it.
void check_layer(const LayerCase& lc, const std::vector<std::pair<int, cpu::KdaMode>>& calls, uint64_t seed) {
  const Layer L = make_layer(lc, seed);
  const cpu::KdaDims& dims = L.dims;
  const int D = dims.proj_dim();
  int max_T = 0;
  for (auto& c : calls) max_T = std::max(max_T, c.first);

  cudaStream_t stream;
  CUDA_CHECK(cudaStreamCreate(&stream));
  {
    cuda::Blas blas(stream);
    // Scratch in an arena of exactly kda_scratch_bytes: an undersized estimate throws.
    cuda::DeviceArena arena(weight_bytes(L.w) + (16 << 20));
    const cuda::DeviceKdaWeights dw = cuda::upload_kda(arena, L.w);
    cuda::DeviceArena scratch_arena(cuda::kda_scratch_bytes(dw, dims, max_T));
    cuda::DeviceBuffer<float> state_buf(cuda::kda_state_floats(dims));
    state_buf.zero();
    const cuda::DeviceKdaState state = cuda::kda_state_at(state_buf.data(), dims);
    cpu::KdaCache cache;
    cache.reset(dims);

    const LayerTolerance tol = tolerance(lc);
    int call_seed = 0;
    for (const auto& [T, mode] : calls) {
      // x as input_layernorm's bf16 output: integers in [-2, 2] (exact_low) or normals.
      std::vector<float> x = lc.exact_low ? random_small_ints(size_t(T) * dims.hidden, seed + 100 + call_seed, -2, 2)
                                          : bf16_rounded(optest::random_normal(size_t(T) * dims.hidden, seed + 100 + call_seed));
      ++call_seed;
      std::vector<float> out_cpu(size_t(T) * dims.hidden);
      cpu::kda_forward(L.w, dims, x.data(), T, cache, out_cpu.data(), mode);

      cuda::DeviceBuffer<cuda::bf16> dx(cuda::to_bf16(x));
      cuda::DeviceBuffer<float> dout(out_cpu.size());
      {
        cuda::Scratch scratch(scratch_arena);
        cuda::kda_forward(blas, dw, dims, dx.data(), T, state, dout.data(), scratch, mode);
      }
      CUDA_CHECK(cudaStreamSynchronize(stream));
      const char* mode_name = mode == cpu::KdaMode::kRecurrent ? "_rec" : mode == cpu::KdaMode::kChunked ? "_chk" : "_auto";
      const std::string shape = lc.name() + "_T" + std::to_string(T) + mode_name + "_call" + std::to_string(call_seed);
      const size_t window = size_t(dims.conv_kernel - 1) * D;
      expect_close("kda_layer_out", shape, normalised_error(dout.download(), out_cpu), tol.out);
      expect_close("kda_layer_conv_q", shape, normalised_error(download(state.conv_q, window), cache.conv_q), tol.window);
      expect_close("kda_layer_conv_k", shape, normalised_error(download(state.conv_k, window), cache.conv_k), tol.window);
      expect_close("kda_layer_conv_v", shape, normalised_error(download(state.conv_v, window), cache.conv_v), tol.window);
      expect_close("kda_layer_S", shape, normalised_error(download(state.S, cache.S.size()), cache.S), tol.S);
    }
  }
  CUDA_CHECK(cudaStreamDestroy(stream));
}

using cpu::KdaMode;

TEST(KdaLayer, K3GateTiny) {
  REQUIRE_GPU();
  check_layer({64, 2, 32, true, true},
              {{5, KdaMode::kChunked}, {1, KdaMode::kAuto}, {7, KdaMode::kRecurrent}, {1, KdaMode::kChunked}}, 700);
}

TEST(KdaLayer, SoftplusLowRankGateTiny) {
  REQUIRE_GPU();
  check_layer({64, 2, 32, false, true},
              {{5, KdaMode::kChunked}, {1, KdaMode::kAuto}, {7, KdaMode::kRecurrent}, {1, KdaMode::kChunked}}, 710);
}

TEST(KdaLayer, Medium) {
  REQUIRE_GPU();
  check_layer({512, 4, 64, true, true}, {{70, KdaMode::kAuto}, {1, KdaMode::kAuto}, {3, KdaMode::kRecurrent}}, 720);
  check_layer({512, 4, 64, false, true}, {{70, KdaMode::kAuto}, {1, KdaMode::kAuto}, {3, KdaMode::kRecurrent}}, 730);
}

// The rounding of the low-rank activations to bf16 (what a bf16 model does), measured.
TEST(KdaLayer, DenseLowRankBf16) {
  REQUIRE_GPU();
  check_layer({512, 4, 64, true, false}, {{70, KdaMode::kAuto}, {1, KdaMode::kAuto}}, 740);
  check_layer({512, 4, 64, false, false}, {{70, KdaMode::kAuto}, {1, KdaMode::kAuto}}, 750);
}

// K3's real layer: hidden 7168, 96 heads x 128.
TEST(KdaLayer, K3Shape) {
  REQUIRE_GPU();
  check_layer({7168, 96, 128, true, true}, {{5, KdaMode::kChunked}, {1, KdaMode::kAuto}, {2, KdaMode::kRecurrent}}, 760);
  check_layer({7168, 96, 128, false, true}, {{5, KdaMode::kAuto}, {1, KdaMode::kAuto}}, 770);
}

}  // namespace
}  // namespace moonrun
