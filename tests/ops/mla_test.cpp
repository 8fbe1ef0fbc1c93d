// cuda::mla_forward (src/kernels/cuda/mla) against cpu::mla_forward, the executable
// specification (K3_SPEC.md §2 "Gated MLA layer"). The CPU gets the bf16-rounded weights and
// inputs the GPU holds; it keeps its cache rows in fp32 while the GPU stores them in bf16 in
// a paged pool (pages in a scrambled order, unused pages between them), so the written rows
// are compared too. Both evaluation orders (plain / absorbed), prefill from an empty cache, a
// chunked prefill continuing a cache, single-token decode, the tiny fixture shapes and K3's
// real one (576-wide rows over ~500 cached positions).
//
// Thresholds (normalised error: max |gpu - cpu| / max |cpu|). bf16 keeps 8 significant
// bits, so rounding to it moves a value by up to 2^-8 (3.9e-3) of itself:
// - kRowTol, a written cache row: the GPU rounds its fp32 row to bf16 once (<= 2^-8 of each
//   element, so <= 2^-8 normalised); its fp32 projection differs from the CPU's only in
//   summation order (~1e-6). Measured up to 3.6e-3 (an element just above a power of two).
// - kOutTol, the layer output: three bf16 roundings the CPU does not make lie on the path (the
//   q_a-normed input of q_b, every cache row, the input of o_proj), each <= 2^-8 relative; the
//   row rounding also reaches the softmax through the logits (|logit| up to ~6 here, so the
//   weights move by up to ~2%, mostly cancelling in the weighted sum). 4 x 2^-8 bounds the
//   sum of the three plus that amplification; measured 1.6e-3 .. 6.9e-3. A wrong position,
//   head, page or mask gives O(1).
// - kModesTol, GPU plain vs GPU absorbed on the same bf16 cache: the two orders agree to fp32
//   rounding (~1e-6) up to o_proj; there an fp32 difference flips the bf16 rounding of an
//   input element only when it sits within ~1e-6 of a midpoint, so a handful of the H*v
//   inputs move by one ulp (2^-7 of themselves) each: far below 1e-3; measured <= 7e-5.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "backend/cpu/mla.h"
#include "backend/cuda/common/cuda_check.h"
#include "backend/cuda/mla/mla_layer.h"
#include "op_test_util.h"

namespace moonrun {
namespace {

using cpu::MlaDims;
using cpu::MlaMode;
using cpu::MlaWeights;
using cuda::bf16;
using optest::bf16_rounded;
using optest::expect_close;
using optest::normalised_error;

constexpr double kRowTol = 4e-3;    // 2^-8 + fp32 summation order
constexpr double kOutTol = 1.6e-2;  // 4 x 2^-8
constexpr double kModesTol = 1e-3;

// ---- shapes ---------------------------------------------------------------------------------
MlaDims make_dims(int hidden, int heads, int q_lora, int kv_lora, int nope, int rope, int v, bool gate) {
  MlaDims d;
  d.hidden = hidden;
  d.num_heads = heads;
  d.q_lora_rank = q_lora;
  d.kv_lora_rank = kv_lora;
  d.qk_nope_head_dim = nope;
  d.qk_rope_head_dim = rope;
  d.v_head_dim = v;
  d.output_gate = gate;
  d.q_a_norm_eps = d.kv_a_norm_eps = 1e-6f;  // as model/layer_dims.h: the MLA norms use 1e-6
  return d;
}
// tests/fixtures/*/config.json: q_lora set + gate; q_lora null + gate + v != nope; neither.
MlaDims k3_tiny_a() { return make_dims(64, 2, 32, 32, 32, 16, 32, true); }
MlaDims k3_tiny_b() { return make_dims(128, 4, 0, 32, 16, 16, 32, true); }
MlaDims kimi_linear_tiny() { return make_dims(64, 2, 0, 32, 32, 16, 32, false); }
// Widths that are not multiples of a warp, v < nope, q_lora without the gate.
MlaDims odd_dims() { return make_dims(96, 3, 24, 40, 24, 8, 20, false); }
// /work/shared/models/kimi-k3.config.json: the 576-wide cache row.
MlaDims k3_dims() { return make_dims(7168, 96, 1536, 512, 128, 64, 128, true); }

std::string mode_name(MlaMode m) {
  return m == MlaMode::kPlain ? "plain" : m == MlaMode::kAbsorbed ? "absorbed" : "auto";
}

// ---- weights and inputs ---------------------------------------------------------------------
// Uniform values of the given standard deviation from a counter hash (splitmix64): K3's 230M
// weights in well under a second, where mt19937 + normal_distribution takes several.
std::vector<float> fast_random(size_t n, uint64_t seed, float stddev) {
  std::vector<float> v(n);
  const float half_width = stddev * std::sqrt(3.0f);
  for (size_t i = 0; i < n; ++i) {
    uint64_t z = seed * 0xD1B54A32D192ED03ull + (i + 1) * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    const float u = static_cast<float>(z >> 40) * (1.0f / 16777216.0f);  // [0, 1)
    v[i] = (2.0f * u - 1.0f) * half_width;
  }
  return v;
}

// bf16-rounded weights with output variance ~gain^2 for unit-variance inputs.
cpu::Linear make_linear(int out, int in, uint64_t seed, float gain = 1.0f) {
  cpu::Linear l;
  l.out_features = out;
  l.in_features = in;
  l.w = bf16_rounded(fast_random(static_cast<size_t>(out) * in, seed, gain / std::sqrt(static_cast<float>(in))));
  return l;
}
std::vector<float> make_norm(int n, uint64_t seed) {
  std::vector<float> w = fast_random(n, seed, 0.25f);
  for (auto& v : w) v += 1.0f;
  return w;
}

// q gain 2: logits of std ~2 (peaked attention), gate gain 2: sigmoid away from 1/2.
MlaWeights make_weights(const MlaDims& d, uint64_t seed) {
  const int H = d.num_heads, QD = d.q_head_dim();
  MlaWeights w;
  if (d.q_lora_rank > 0) {
    w.q_a_proj = make_linear(d.q_lora_rank, d.hidden, seed + 1);
    w.q_a_layernorm = make_norm(d.q_lora_rank, seed + 2);
    w.q_b_proj = make_linear(H * QD, d.q_lora_rank, seed + 3, 2.0f);
  } else {
    w.q_proj = make_linear(H * QD, d.hidden, seed + 4, 2.0f);
  }
  w.kv_a_proj_with_mqa = make_linear(d.kv_lora_rank + d.qk_rope_head_dim, d.hidden, seed + 5);
  w.kv_a_layernorm = make_norm(d.kv_lora_rank, seed + 6);
  w.kv_b_proj = make_linear(H * (d.qk_nope_head_dim + d.v_head_dim), d.kv_lora_rank, seed + 7);
  w.o_proj = make_linear(d.hidden, H * d.v_head_dim, seed + 8);
  if (d.output_gate) w.g_proj = make_linear(H * d.v_head_dim, d.hidden, seed + 9, 2.0f);
  return w;
}

// x [n_tokens, hidden]: what the bf16 input holds.
std::vector<float> make_x(const MlaDims& d, int n_tokens, uint64_t seed) {
  return bf16_rounded(optest::random_normal(static_cast<size_t>(n_tokens) * d.hidden, seed));
}

// ---- the paged cache on both sides -----------------------------------------------------------
// Device pool of 2 * n_pages + 1 pages, NaN everywhere; the sequence's page table is a
// scrambled subset of them. A read of a row never written gives NaN in the output, a write to
// the wrong page is caught by unused_pages_untouched().
class PagedCache {
 public:
  PagedCache(int row, int page_size, int capacity_positions, uint64_t seed)
      : row_(row), page_size_(page_size), n_pages_((capacity_positions + page_size - 1) / page_size),
        pool_pages_(2 * n_pages_ + 1), pool_host_(static_cast<size_t>(pool_pages_) * page_size * row,
                                                  __float2bfloat16_rn(NAN)),
        cpu_rows_(static_cast<size_t>(n_pages_) * page_size * row, NAN) {
    std::vector<int32_t> all(pool_pages_);
    std::iota(all.begin(), all.end(), 0);
    std::mt19937_64 gen(seed);
    std::shuffle(all.begin(), all.end(), gen);
    table_.assign(all.begin(), all.begin() + n_pages_);
    pool_ = cuda::DeviceBuffer<bf16>(pool_host_);
    table_d_ = cuda::DeviceBuffer<int32_t>(table_);
    for (int p = 0; p < n_pages_ * page_size; ++p) cpu_ptrs_.push_back(&cpu_rows_[static_cast<size_t>(p) * row]);
  }

  cuda::DeviceMlaCache view() {
    return cuda::DeviceMlaCache{pool_.data(), page_size_, n_pages_, table_d_.data()};
  }
  float* const* cpu_rows() { return cpu_ptrs_.data(); }

  // Positions [0, n) hold the same random bf16 rows on both sides (a cache filled earlier).
  void fill_random(int n, uint64_t seed) {
    const std::vector<float> v = bf16_rounded(fast_random(static_cast<size_t>(n) * row_, seed, 1.0f));
    for (int p = 0; p < n; ++p) {
      std::copy(&v[static_cast<size_t>(p) * row_], &v[static_cast<size_t>(p + 1) * row_], cpu_ptrs_[p]);
      bf16* dst = &pool_host_[slot(p) * row_];
      for (int i = 0; i < row_; ++i) dst[i] = __float2bfloat16_rn(v[static_cast<size_t>(p) * row_ + i]);
    }
    pool_.upload(pool_host_);
  }

  // Rows [p0, p0 + n) as the GPU stored them / as the CPU did.
  std::vector<float> gpu_rows(int p0, int n) {
    pool_host_ = pool_.download();
    std::vector<float> out;
    for (int p = p0; p < p0 + n; ++p)
      for (int i = 0; i < row_; ++i) out.push_back(__bfloat162float(pool_host_[slot(p) * row_ + i]));
    return out;
  }
  std::vector<float> cpu_rows(int p0, int n) const {
    return std::vector<float>(cpu_rows_.begin() + static_cast<size_t>(p0) * row_,
                              cpu_rows_.begin() + static_cast<size_t>(p0 + n) * row_);
  }

  // Pages outside the table still hold only NaN.
  bool unused_pages_untouched() {
    pool_host_ = pool_.download();
    std::vector<bool> used(pool_pages_, false);
    for (int32_t pg : table_) used[pg] = true;
    for (int pg = 0; pg < pool_pages_; ++pg) {
      if (used[pg]) continue;
      for (size_t i = 0; i < static_cast<size_t>(page_size_) * row_; ++i)
        if (!std::isnan(__bfloat162float(pool_host_[static_cast<size_t>(pg) * page_size_ * row_ + i]))) return false;
    }
    return true;
  }

 private:
  size_t slot(int p) const { return static_cast<size_t>(table_[p / page_size_]) * page_size_ + p % page_size_; }

  int row_, page_size_, n_pages_, pool_pages_;
  std::vector<bf16> pool_host_;
  std::vector<int32_t> table_;
  cuda::DeviceBuffer<bf16> pool_;
  cuda::DeviceBuffer<int32_t> table_d_;
  std::vector<float> cpu_rows_;  // [n_pages * page_size, row]
  std::vector<float*> cpu_ptrs_;
};

// ---- one layer on both sides -----------------------------------------------------------------
size_t weight_bytes(const MlaWeights& w) {
  size_t n = 0;
  for (const cpu::Linear* l : {&w.q_a_proj, &w.q_b_proj, &w.q_proj, &w.kv_a_proj_with_mqa, &w.kv_b_proj,
                               &w.o_proj, &w.g_proj})
    n += l->w.size() * sizeof(bf16) + 256;
  return n + (w.q_a_layernorm.size() + w.kv_a_layernorm.size()) * sizeof(float) + 512;
}
class Layer {
 public:
  Layer(const MlaDims& d, uint64_t seed, int max_tokens, int max_positions)
      : Layer(d, make_weights(d, seed), max_tokens, max_positions) {}
  Layer(const MlaDims& d, MlaWeights w, int max_tokens, int max_positions)
      : dims_(d), w_(std::move(w)),
        arena_(weight_bytes(w_) + std::max(cuda::mla_scratch_bytes(d, max_tokens, max_positions - max_tokens,
                                                                       MlaMode::kPlain),
                                            cuda::mla_scratch_bytes(d, max_tokens, max_positions - max_tokens,
                                                                    MlaMode::kAbsorbed))) {
    CUDA_CHECK(cudaStreamCreate(&stream_));
    blas_ = std::make_unique<cuda::Blas>(stream_);
    dw_ = cuda::upload_mla(arena_, w_);
  }
  ~Layer() {
    blas_.reset();
    cudaStreamDestroy(stream_);
  }

  std::vector<float> gpu(const std::vector<float>& x, int n_tokens, int n_past, PagedCache& cache, MlaMode mode) {
    cuda::DeviceBuffer<bf16> x_d(cuda::to_bf16(x));
    cuda::DeviceBuffer<float> out_d(static_cast<size_t>(n_tokens) * dims_.hidden);
    {
      cuda::Scratch scratch(arena_);
      cuda::mla_forward(*blas_, dw_, dims_, x_d.data(), n_tokens, n_past, cache.view(), out_d.data(), scratch, mode);
    }
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    return out_d.download();
  }
  // Milliseconds per mla_forward call on the device (average of `reps`, after one warm-up).
  float gpu_ms(const std::vector<float>& x, int n_tokens, int n_past, PagedCache& cache, MlaMode mode, int reps) {
    cuda::DeviceBuffer<bf16> x_d(cuda::to_bf16(x));
    cuda::DeviceBuffer<float> out_d(static_cast<size_t>(n_tokens) * dims_.hidden);
    cudaEvent_t start, stop;
    CUDA_CHECK(cudaEventCreate(&start));
    CUDA_CHECK(cudaEventCreate(&stop));
    for (int r = -1; r < reps; ++r) {
      if (r == 0) CUDA_CHECK(cudaEventRecord(start, stream_));
      cuda::Scratch scratch(arena_);
      cuda::mla_forward(*blas_, dw_, dims_, x_d.data(), n_tokens, n_past, cache.view(), out_d.data(), scratch, mode);
    }
    CUDA_CHECK(cudaEventRecord(stop, stream_));
    CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    CUDA_CHECK(cudaEventDestroy(start));
    CUDA_CHECK(cudaEventDestroy(stop));
    return ms / reps;
  }
  std::vector<float> cpu(const std::vector<float>& x, int n_tokens, int n_past, PagedCache& cache, MlaMode mode) {
    std::vector<float> out(static_cast<size_t>(n_tokens) * dims_.hidden);
    cpu::mla_forward(w_, dims_, x.data(), n_tokens, n_past, cache.cpu_rows(), out.data(), mode);
    return out;
  }
  const MlaDims& dims() const { return dims_; }

 private:
  MlaDims dims_;
  MlaWeights w_;
  cuda::DeviceArena arena_;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<cuda::Blas> blas_;
  cuda::DeviceMlaWeights dw_;
};

// One step on both sides: the output and the rows written, each checked; returns nothing,
// prints one OPERR line per check.
void step_and_compare(Layer& layer, PagedCache& cache, const std::string& tag, int n_tokens, int n_past,
                      MlaMode mode, uint64_t seed) {
  const std::vector<float> x = make_x(layer.dims(), n_tokens, seed);
  const std::vector<float> got = layer.gpu(x, n_tokens, n_past, cache, mode);
  const std::vector<float> want = layer.cpu(x, n_tokens, n_past, cache, mode);
  const std::string shape = tag + "/" + mode_name(mode) + "/T" + std::to_string(n_tokens) + "@" +
                            std::to_string(n_past);
  expect_close("mla_out", shape, normalised_error(got, want), kOutTol);
  expect_close("mla_rows", shape, normalised_error(cache.gpu_rows(n_past, n_tokens), cache.cpu_rows(n_past, n_tokens)),
               kRowTol);
}

// Prefill 7 from an empty cache, a chunk of 5 continuing it, then 4 single-token decodes;
// pages of 4 positions so that every step crosses a page boundary.
void run_sequence(const std::string& name, const MlaDims& d, uint64_t seed) {
  for (MlaMode mode : {MlaMode::kAuto, MlaMode::kPlain, MlaMode::kAbsorbed}) {
    Layer layer(d, seed, 8, 16);
    PagedCache cache(d.cache_row(), 4, 16, seed + 100);
    int n_past = 0;
    for (int n_tokens : {7, 5, 1, 1, 1, 1}) {
      step_and_compare(layer, cache, name, n_tokens, n_past, mode, seed + 1000 + n_past);
      n_past += n_tokens;
    }
    EXPECT_TRUE(cache.unused_pages_untouched()) << name << " " << mode_name(mode);
  }
}

TEST(MlaOp, SequenceK3TinyA) {
  REQUIRE_GPU();
  run_sequence("k3-tiny-a", k3_tiny_a(), 11);
}
TEST(MlaOp, SequenceK3TinyB) {
  REQUIRE_GPU();
  run_sequence("k3-tiny-b", k3_tiny_b(), 12);
}
TEST(MlaOp, SequenceKimiLinearTiny) {
  REQUIRE_GPU();
  run_sequence("kimi-linear-tiny", kimi_linear_tiny(), 13);
}
TEST(MlaOp, SequenceOddDims) {
  REQUIRE_GPU();
  run_sequence("odd", odd_dims(), 14);
}

// GPU plain vs GPU absorbed over the same bf16 cache (same rows rewritten identically).
void compare_modes(Layer& layer, PagedCache& cache, const std::string& tag, int n_tokens, int n_past,
                   uint64_t seed) {
  const std::vector<float> x = make_x(layer.dims(), n_tokens, seed);
  const std::vector<float> plain = layer.gpu(x, n_tokens, n_past, cache, MlaMode::kPlain);
  const std::vector<float> absorbed = layer.gpu(x, n_tokens, n_past, cache, MlaMode::kAbsorbed);
  expect_close("mla_plain_vs_absorbed", tag + "/T" + std::to_string(n_tokens) + "@" + std::to_string(n_past),
               normalised_error(absorbed, plain), kModesTol);
}

// A cache of 300 filled positions: more than one 256-position chunk of the attention kernel,
// a 40-token chunk over it and two decodes, pages of 16.
TEST(MlaOp, LongCacheTinyShapes) {
  REQUIRE_GPU();
  for (const auto& [name, d] : {std::pair{"k3-tiny-a", k3_tiny_a()}, std::pair{"odd", odd_dims()}}) {
    for (MlaMode mode : {MlaMode::kPlain, MlaMode::kAbsorbed}) {
      Layer layer(d, 21, 40, 342);
      PagedCache cache(d.cache_row(), 16, 342, 22);
      cache.fill_random(300, 23);
      step_and_compare(layer, cache, name, 40, 300, mode, 24);
      step_and_compare(layer, cache, name, 1, 340, mode, 25);
      step_and_compare(layer, cache, name, 1, 341, mode, 26);
      compare_modes(layer, cache, name, 40, 300, 24);
      compare_modes(layer, cache, name, 1, 340, 25);
      EXPECT_TRUE(cache.unused_pages_untouched()) << name;
    }
  }
}

// A 100-token prompt into an empty cache with few heads: the attention splits each query's
// positions in two, and the early queries see nothing of the second split (empty partials).
TEST(MlaOp, PromptSplitsTinyShapes) {
  REQUIRE_GPU();
  for (const auto& [name, d] : {std::pair{"k3-tiny-a", k3_tiny_a()}, std::pair{"odd", odd_dims()}}) {
    for (MlaMode mode : {MlaMode::kPlain, MlaMode::kAbsorbed}) {
      Layer layer(d, 51, 100, 101);
      PagedCache cache(d.cache_row(), 16, 101, 52);
      step_and_compare(layer, cache, name, 100, 0, mode, 53);
      step_and_compare(layer, cache, name, 1, 100, mode, 54);
      EXPECT_TRUE(cache.unused_pages_untouched()) << name;
    }
  }
}

// K3's real shape: 96 heads, q_lora 1536, kv_lora 512, nope 128, rope 64, v 128, hidden 7168,
// over 500 cached positions (pages of 64): a 4-token chunk in each mode, then one decode token
// (kAuto: absorbed), and plain vs absorbed on the GPU for both.
TEST(MlaOp, K3ShapeOverLongCache) {
  REQUIRE_GPU();
  const MlaDims d = k3_dims();
  Layer layer(d, 31, 512, 512);
  for (MlaMode mode : {MlaMode::kPlain, MlaMode::kAbsorbed}) {
    PagedCache cache(d.cache_row(), 64, 505, 32);
    cache.fill_random(500, 33);
    step_and_compare(layer, cache, "k3", 4, 500, mode, 34);
    step_and_compare(layer, cache, "k3", 1, 504, MlaMode::kAuto, 35);
    if (mode == MlaMode::kPlain) {
      compare_modes(layer, cache, "k3", 4, 500, 34);
      compare_modes(layer, cache, "k3", 1, 504, 35);
    }
    EXPECT_TRUE(cache.unused_pages_untouched());
    if (mode == MlaMode::kPlain) {
      // Not a check, a figure for the report (rewrites the same rows with the same values).
      std::printf("MLA k3 timing: T4@500 plain %.3f ms, absorbed %.3f ms; T1@504 plain %.3f ms, absorbed %.3f ms\n",
                  layer.gpu_ms(make_x(d, 4, 34), 4, 500, cache, MlaMode::kPlain, 10),
                  layer.gpu_ms(make_x(d, 4, 34), 4, 500, cache, MlaMode::kAbsorbed, 10),
                  layer.gpu_ms(make_x(d, 1, 35), 1, 504, cache, MlaMode::kPlain, 10),
                  layer.gpu_ms(make_x(d, 1, 35), 1, 504, cache, MlaMode::kAbsorbed, 10));
      PagedCache prompt(d.cache_row(), 64, 512, 36);
      std::printf("MLA k3 timing: prefill T512@0 plain %.3f ms\n",
                  layer.gpu_ms(make_x(d, 512, 37), 512, 0, prompt, MlaMode::kPlain, 3));
    }
  }
}

// Small-integer x and kv_a weights, kv_lora 32 (a power of two: mean(x^2) is exact): the
// projection and the norm are the same fp32 arithmetic on both sides, so the GPU's rows (at
// their scrambled pages) are the CPU's fp32 rows rounded to bf16, bit for bit (k_pe: integers
// up to 128, exact; latent: the same fp32 value, the same rounding).
TEST(MlaOp, CacheRowsExactOnSmallIntegers) {
  REQUIRE_GPU();
  const MlaDims d = k3_tiny_a();
  MlaWeights w = make_weights(d, 41);
  // |row value| <= hidden 64 * 2 * 1 = 128: an integer, exact in fp32 sums and in bf16.
  w.kv_a_proj_with_mqa.w = optest::random_small_ints(w.kv_a_proj_with_mqa.w.size(), 42, -1, 1);
  Layer layer(d, std::move(w), 8, 16);
  PagedCache cache(d.cache_row(), 4, 16, 43);
  int n_past = 0;
  for (int n_tokens : {7, 5, 1}) {
    const std::vector<float> x = optest::random_small_ints(static_cast<size_t>(n_tokens) * d.hidden, 44 + n_past, -2, 2);
    // Outputs not compared here: k_pe values up to 128 make the logits huge (see the other tests).
    layer.gpu(x, n_tokens, n_past, cache, MlaMode::kAuto);
    layer.cpu(x, n_tokens, n_past, cache, MlaMode::kAuto);
    const std::string shape = "k3-tiny-a/ints/T" + std::to_string(n_tokens) + "@" + std::to_string(n_past);
    optest::expect_exact("mla_rows", shape, cache.gpu_rows(n_past, n_tokens),
                         bf16_rounded(cache.cpu_rows(n_past, n_tokens)));
    n_past += n_tokens;
  }
  EXPECT_TRUE(cache.unused_pages_untouched());
}

}  // namespace
}  // namespace moonrun
