// The dense per-token ops against their CPU twins: embed_tokens (cpu/embedding.h),
// rmsnorm (cpu::rmsnorm), attn_res_mix (cpu::attn_res_mix), gated_activation (cpu::situ,
// cpu::silu_mul), add, to_bf16, and mlp_forward (cpu::mlp_forward).
// Shapes: hidden 7168 (K3) for embed / rmsnorm / the AttnRes mix (0, 1 and 8 completed
// blocks), the KV latent 512 and latent-MoE 3584 norms, odd 1 / 17 / 1000 widths; the
// activations at T x 33792 (dense FFN) and T x 6144 (shared experts); the MLP at K3's shared
// expert (7168 -> 6144 -> 7168), K3's dense FFN (7168 -> 33792 -> 7168, 2 tokens) and small
// odd ones (33 -> 17).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <vector>

#include "backend/cpu/activations.h"
#include "backend/cpu/attn_res.h"
#include "backend/cpu/embedding.h"
#include "backend/cpu/linear.h"
#include "backend/cpu/mlp.h"
#include "backend/cuda/common/device_buffer.h"
#include "backend/cuda/dense/dense_ops.h"
#include "op_test_util.h"
#include "core_inputs.h"

namespace moonrun::cuda {
namespace {

using optest::bf16_rounded;
using optest::expect_close;
using optest::expect_exact;
using optest::fast_small_ints;
using optest::fast_uniform;
using optest::normalised_error;
using optest::shape_str;

// RMSNorm: the same float operations in the same order as the CPU; only the double sum of
// squares is added up in another order, which moves float(ss / dim) by at most one ulp in
// rare rows. One fp32 ulp of the scale is 2^-23 relative; 1e-6 leaves room for a few.
constexpr double kNormThreshold = 1e-6;
// A bf16 output: one more rounding; bf16 keeps 8 significant bits, so at most 2^-8 of the
// value. (+1e-5: the fp32 twin's own few-ulp differences, e.g. CUDA's tanhf / expf.)
constexpr double kBf16Threshold = 0x1.0p-8 + 1e-5;
// The mix: softmax weights through CUDA's expf (<= 2 ulp from glibc's) on top of the
// double-summed scores; the weighted sum is formed in the CPU's order. A few fp32 ulp.
constexpr double kMixThreshold = 4e-6;

TEST(DenseOpsTest, EmbedTokens) {
  REQUIRE_GPU();
  for (auto [vocab, hidden, n_tokens] : {std::tuple{4096, 7168, 9}, std::tuple{7, 17, 5}, std::tuple{1, 1, 1}}) {
    const std::string shape = shape_str({vocab, hidden, n_tokens});
    std::printf("embed_tokens shape vocab x hidden x T = %s\n", shape.c_str());
    const auto table = fast_uniform(static_cast<size_t>(vocab) * hidden, 10 + vocab, -2.0f, 2.0f, true);
    std::vector<int32_t> ids(n_tokens);
    for (int t = 0; t < n_tokens; ++t) ids[t] = static_cast<int32_t>((t * 2654435761u) % vocab);
    ids[0] = vocab - 1;  // the last row
    std::vector<float> want(static_cast<size_t>(n_tokens) * hidden);
    cpu::embed_tokens(table.data(), hidden, ids.data(), n_tokens, want.data());
    DeviceBuffer<bf16> d_table(to_bf16(table));
    DeviceBuffer<int32_t> d_ids(ids);
    DeviceBuffer<float> d_out(want.size());
    embed_tokens(d_table.data(), hidden, d_ids.data(), n_tokens, d_out.data(), nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
    expect_exact("embed_tokens", shape, d_out.download(), want);  // a bf16 -> fp32 copy is exact
  }
}

TEST(DenseOpsTest, RmsNorm) {
  REQUIRE_GPU();
  for (auto [n_rows, dim] : {std::pair{1, 7168}, std::pair{5, 7168}, std::pair{3, 512}, std::pair{7, 3584},
                             std::pair{4, 1}, std::pair{2, 1000}}) {
    for (bool with_weight : {true, false}) {
      const std::string shape = shape_str({n_rows, dim}) + (with_weight ? "" : "_noweight");
      std::printf("rmsnorm shape rows x dim = %s\n", shape.c_str());
      // Residual-stream-like rows: an offset and a spread, fp32 (not bf16: the input is fp32).
      const auto x = fast_uniform(static_cast<size_t>(n_rows) * dim, 20 + dim, -3.0f, 5.0f);
      const auto w = fast_uniform(dim, 21 + dim, 0.5f, 1.5f);
      const float* wp = with_weight ? w.data() : nullptr;
      std::vector<float> want(x.size());
      cpu::rmsnorm(x.data(), n_rows, dim, wp, 1e-5f, want.data());
      DeviceBuffer<float> d_x(x), d_w(w), d_y(x.size());
      DeviceBuffer<bf16> d_y16(x.size());
      const float* dwp = with_weight ? d_w.data() : nullptr;
      rmsnorm(d_x.data(), n_rows, dim, dwp, 1e-5f, d_y.data(), nullptr);
      rmsnorm(d_x.data(), n_rows, dim, dwp, 1e-5f, d_y16.data(), nullptr);
      CUDA_CHECK(cudaDeviceSynchronize());
      expect_close("rmsnorm_f32", shape, normalised_error(d_y.download(), want), kNormThreshold);
      expect_close("rmsnorm_bf16", shape, normalised_error(to_float(d_y16.download()), want), kBf16Threshold);
    }
  }
}

// Small integers: the sum of squares is exact in double in any order, and everything after
// it is the same float operations: bit-exact, fp32 and (rounded once) bf16.
TEST(DenseOpsTest, RmsNormExactOnSmallIntegers) {
  REQUIRE_GPU();
  for (auto [n_rows, dim] : {std::pair{3, 7168}, std::pair{2, 17}}) {
    const std::string shape = shape_str({n_rows, dim});
    std::printf("rmsnorm exact shape rows x dim = %s\n", shape.c_str());
    const auto x = fast_small_ints(static_cast<size_t>(n_rows) * dim, 30 + dim, -8, 8);
    const auto w = fast_small_ints(dim, 31 + dim, 1, 3);
    std::vector<float> want(x.size());
    cpu::rmsnorm(x.data(), n_rows, dim, w.data(), 1e-5f, want.data());
    DeviceBuffer<float> d_x(x), d_w(w), d_y(x.size());
    DeviceBuffer<bf16> d_y16(x.size());
    rmsnorm(d_x.data(), n_rows, dim, d_w.data(), 1e-5f, d_y.data(), nullptr);
    rmsnorm(d_x.data(), n_rows, dim, d_w.data(), 1e-5f, d_y16.data(), nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
    expect_exact("rmsnorm_exact_f32", shape, d_y.download(), want);
    expect_exact("rmsnorm_exact_bf16", shape, to_float(d_y16.download()), bf16_rounded(want));
  }
}

// Runs the mix on the device; blocks: host vectors, uploaded and passed as a device array of
// device pointers. in_place: out = prefix's buffer.
std::vector<float> gpu_mix(const std::vector<float>& prefix, const std::vector<std::vector<float>>& blocks,
                           int n_tokens, int hidden, const std::vector<float>& w_norm,
                           const std::vector<float>& w_proj, bool in_place) {
  DeviceBuffer<float> d_prefix(prefix), d_wn(w_norm), d_wp(w_proj), d_out(prefix.size());
  std::vector<DeviceBuffer<float>> d_blocks;
  std::vector<const float*> ptrs;
  for (const auto& b : blocks) {
    d_blocks.emplace_back(b);
    ptrs.push_back(d_blocks.back().data());
  }
  DeviceBuffer<const float*> d_ptrs(ptrs.size());
  if (!ptrs.empty()) d_ptrs.upload(ptrs);
  float* out = in_place ? d_prefix.data() : d_out.data();
  attn_res_mix(d_prefix.data(), d_ptrs.data(), static_cast<int>(blocks.size()), n_tokens, hidden, d_wn.data(),
               d_wp.data(), 1e-5f, out, nullptr);
  CUDA_CHECK(cudaDeviceSynchronize());
  return in_place ? d_prefix.download() : d_out.download();
}

std::vector<float> cpu_mix(const std::vector<float>& prefix, const std::vector<std::vector<float>>& blocks,
                           int n_tokens, int hidden, const std::vector<float>& w_norm,
                           const std::vector<float>& w_proj) {
  std::vector<const float*> ptrs;
  for (const auto& b : blocks) ptrs.push_back(b.data());
  std::vector<float> out(prefix.size());
  cpu::attn_res_mix(prefix.data(), ptrs.data(), static_cast<int>(blocks.size()), n_tokens, hidden, w_norm.data(),
                    w_proj.data(), 1e-5f, out.data());
  return out;
}

TEST(DenseOpsTest, AttnResMix) {
  REQUIRE_GPU();
  for (auto [n_blocks, n_tokens, hidden] : {std::tuple{0, 3, 7168}, std::tuple{1, 1, 7168}, std::tuple{8, 5, 7168},
                                            std::tuple{3, 2, 17}, std::tuple{2, 4, 1}}) {
    for (bool in_place : {false, true}) {
      const std::string shape = shape_str({n_blocks, n_tokens, hidden}) + (in_place ? "_inplace" : "");
      std::printf("attn_res_mix shape blocks x T x hidden = %s\n", shape.c_str());
      const size_t n = static_cast<size_t>(n_tokens) * hidden;
      const auto prefix = fast_uniform(n, 40 + hidden, -2.0f, 2.0f);
      std::vector<std::vector<float>> blocks;
      for (int b = 0; b < n_blocks; ++b) blocks.push_back(fast_uniform(n, 41 + b, -1.0f - b, 1.0f + 0.5f * b));
      // w_proj spread wide enough that the softmax over depth is far from uniform.
      const auto w_norm = fast_uniform(hidden, 50, 0.5f, 1.5f);
      const auto w_proj = fast_uniform(hidden, 51, -0.2f, 0.2f);
      const auto want = cpu_mix(prefix, blocks, n_tokens, hidden, w_norm, w_proj);
      const auto got = gpu_mix(prefix, blocks, n_tokens, hidden, w_norm, w_proj, in_place);
      expect_close("attn_res_mix", shape, normalised_error(got, want), kMixThreshold);
    }
  }
}

// Blocks that are channel rotations of the prefix, with w_norm = w_proj = 1: every V_i has
// the same sum and sum of squares (exact, small integers), so the scores tie exactly,
// exp(0) = 1, each weight is 1/4, and the mix of small integers times 1/4 is exact.
TEST(DenseOpsTest, AttnResMixExactOnTiedScores) {
  REQUIRE_GPU();
  const int n_tokens = 3, hidden = 7168, n_blocks = 3;
  std::printf("attn_res_mix exact shape blocks x T x hidden = %s\n", shape_str({n_blocks, n_tokens, hidden}).c_str());
  const auto prefix = fast_small_ints(static_cast<size_t>(n_tokens) * hidden, 60, -6, 6);
  std::vector<std::vector<float>> blocks(n_blocks, prefix);
  for (int b = 0; b < n_blocks; ++b)
    for (int t = 0; t < n_tokens; ++t)
      for (int c = 0; c < hidden; ++c)
        blocks[b][static_cast<size_t>(t) * hidden + c] = prefix[static_cast<size_t>(t) * hidden + (c + 7 * (b + 1)) % hidden];
  const std::vector<float> ones(hidden, 1.0f);
  const auto want = cpu_mix(prefix, blocks, n_tokens, hidden, ones, ones);
  expect_exact("attn_res_mix_exact", shape_str({n_blocks, n_tokens, hidden}),
               gpu_mix(prefix, blocks, n_tokens, hidden, ones, ones, true), want);
}

TEST(DenseOpsTest, GatedActivation) {
  REQUIRE_GPU();
  const cpu::ActivationParams situ_k3{true, 4.0f, 25.0f}, situ_nolin{true, 4.0f, 0.0f}, swiglu{false, 0, 0};
  for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{33792}, int64_t{3} * 33792, int64_t{5} * 6144}) {
    for (const auto& [name, act] : {std::pair{"situ", situ_k3}, std::pair{"situ_nolin", situ_nolin},
                                    std::pair{"swiglu", swiglu}}) {
      const std::string shape = std::to_string(n);
      std::printf("gated_activation %s shape n = %s\n", name, shape.c_str());
      // Wide enough to reach both saturations of tanh and the sigmoid (|x| up to 60).
      auto g = fast_uniform(n, 70 + n, -12.0f, 12.0f);
      auto u = fast_uniform(n, 71 + n, -60.0f, 60.0f);
      std::vector<float> want(n);
      for (int64_t i = 0; i < n; ++i)
        want[i] = act.situ ? cpu::situ(g[i], u[i], act.beta, act.linear_beta) : cpu::silu_mul(g[i], u[i]);
      DeviceBuffer<float> d_g(g), d_u(u);
      DeviceBuffer<bf16> d_out(n);
      gated_activation(d_g.data(), d_u.data(), n, act, d_out.data(), nullptr);
      CUDA_CHECK(cudaDeviceSynchronize());
      // bf16 output: 2^-8 of the value, plus tanhf / expf within a few ulp of glibc's.
      expect_close(std::string("gated_activation_") + name, shape,
                   normalised_error(to_float(d_out.download()), want), kBf16Threshold);
    }
  }
}

TEST(DenseOpsTest, AddAndToBf16AreExact) {
  REQUIRE_GPU();
  for (int64_t n : {int64_t{1}, int64_t{1001}, int64_t{9} * 7168}) {
    std::printf("add/to_bf16 shape n = %lld\n", static_cast<long long>(n));
    const auto a = fast_uniform(n, 80 + n, -100.0f, 100.0f);
    const auto b = fast_uniform(n, 81 + n, -1.0f, 1.0f);
    std::vector<float> sum(n);
    for (int64_t i = 0; i < n; ++i) sum[i] = a[i] + b[i];
    DeviceBuffer<float> d_a(a), d_b(b), d_y(n);
    DeviceBuffer<bf16> d_h(n);
    add(d_a.data(), d_b.data(), n, d_y.data(), nullptr);
    add(d_a.data(), d_b.data(), n, d_a.data(), nullptr);  // y aliasing a
    to_bf16(d_y.data(), n, d_h.data(), nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
    expect_exact("add", std::to_string(n), d_y.download(), sum);  // IEEE add: one rounding, both sides
    expect_exact("add_inplace", std::to_string(n), d_a.download(), sum);
    expect_exact("to_bf16", std::to_string(n), to_float(d_h.download()), bf16_rounded(sum));
  }
}

// The weights for one MLP case: bf16-valued (what the GPU holds), scaled by 1/sqrt(fan_in) so
// that the activations sit in SiTU's curved region rather than saturating.
cpu::MlpWeights random_mlp(int in, int inter, uint64_t seed) {
  cpu::MlpWeights w;
  auto lin = [](int out, int in_f, uint64_t s) {
    const float r = 1.7f / std::sqrt(static_cast<float>(in_f));
    return cpu::Linear{fast_uniform(static_cast<size_t>(out) * in_f, s, -r, r, true), out, in_f};
  };
  w.gate = lin(inter, in, seed);
  w.up = lin(inter, in, seed + 1);
  w.down = lin(in, inter, seed + 2);
  return w;
}

// The CPU MLP with the GPU's one extra rounding (act(g, u) stored as bf16 before down):
// the reference that measures the kernels rather than the storage format.
std::vector<float> cpu_mlp_bf16_hidden(const cpu::MlpWeights& w, const cpu::ActivationParams& act,
                                       const std::vector<float>& x, int n_tokens) {
  const int inter = w.gate.out_features;
  std::vector<float> g(static_cast<size_t>(n_tokens) * inter), u(g.size());
  cpu::apply(w.gate, x.data(), n_tokens, g.data());
  cpu::apply(w.up, x.data(), n_tokens, u.data());
  for (size_t i = 0; i < g.size(); ++i)
    g[i] = round_bf16(act.situ ? cpu::situ(g[i], u[i], act.beta, act.linear_beta) : cpu::silu_mul(g[i], u[i]));
  std::vector<float> out(x.size());
  cpu::apply(w.down, g.data(), n_tokens, out.data());
  return out;
}

// vs the bf16-hidden twin: fp32 sum-order differences in g and u (~1e-6) flip the bf16
// rounding of an occasional h element to the neighbouring bf16 value (2^-7 of it); each flip
// moves an output by ~2^-7 |h_j w_j|, ~2^-7 / sqrt(inter) of the output's scale, and at
// inter = 6144..33792 a row has a few dozen flips. Measured: up to 4e-4 (7168x6144 SwiGLU).
// A wrong kernel (activation, layout) is off by O(1).
constexpr double kMlpTwinThreshold = 1e-3;
// vs cpu::mlp_forward (no bf16 rounding of h): every h_j carries its own rounding error of
// up to 2^-8 relative (rms ~2^-8 / sqrt(6) over the mantissa range), which averages out in
// the down projection to ~1.5e-3 of the output's scale; with inter = 17 a few large terms
// dominate. 2^-7 bounds it. Measured: 1.3e-3 .. 2.5e-3.
constexpr double kMlpCpuThreshold = 0x1.0p-7;

struct MlpCase {
  int n_tokens, in, inter;
  cpu::ActivationParams act;
  const char* act_name;
};

void check_mlp(const MlpCase& c) {
  const std::string shape = shape_str({c.n_tokens, c.in, c.inter}) + "_" + c.act_name;
  std::printf("mlp_forward shape T x in x inter = %s\n", shape.c_str());
  const cpu::MlpWeights w = random_mlp(c.in, c.inter, 90 + c.inter);
  const auto x = fast_uniform(static_cast<size_t>(c.n_tokens) * c.in, 91 + c.in, -1.0f, 1.0f, true);
  std::vector<float> want(x.size());
  cpu::mlp_forward(w, c.act, x.data(), c.n_tokens, want.data());
  const auto want_twin = cpu_mlp_bf16_hidden(w, c.act, x, c.n_tokens);

  const size_t weight_bytes = 3 * static_cast<size_t>(c.in) * c.inter * sizeof(bf16);
  const size_t scratch_bytes = static_cast<size_t>(c.n_tokens) * c.inter * 10 + (4 << 10);
  DeviceArena arena(weight_bytes + scratch_bytes + (1 << 20));
  const DeviceMlpWeights dw = upload_mlp(arena, w);
  cudaStream_t stream;
  CUDA_CHECK(cudaStreamCreate(&stream));
  std::vector<float> got;
  {
    Blas blas(stream);
    DeviceBuffer<bf16> d_x(to_bf16(x));
    DeviceBuffer<float> d_out(x.size());
    {
      Scratch scratch(arena);
      mlp_forward(blas, dw, c.act, d_x.data(), c.n_tokens, d_out.data(), scratch);
    }
    CUDA_CHECK(cudaStreamSynchronize(stream));
    got = d_out.download();
  }
  CUDA_CHECK(cudaStreamDestroy(stream));
  expect_close("mlp_forward_vs_bf16_hidden_twin", shape, normalised_error(got, want_twin), kMlpTwinThreshold);
  expect_close("mlp_forward_vs_cpu", shape, normalised_error(got, want), kMlpCpuThreshold);
}

const cpu::ActivationParams kSituK3{true, 4.0f, 25.0f}, kSwiglu{false, 0, 0};

TEST(DenseOpsTest, MlpForwardSmall) {
  REQUIRE_GPU();
  check_mlp({3, 64, 96, kSituK3, "situ"});
  check_mlp({5, 33, 17, kSwiglu, "swiglu"});
}

TEST(DenseOpsTest, MlpForwardK3SharedExperts) {
  REQUIRE_GPU();
  check_mlp({1, 7168, 6144, kSituK3, "situ"});
  check_mlp({4, 7168, 6144, kSwiglu, "swiglu"});
}

TEST(DenseOpsTest, MlpForwardK3DenseFfn) {
  REQUIRE_GPU();
  check_mlp({2, 7168, 33792, kSituK3, "situ"});
}

}  // namespace
}  // namespace moonrun::cuda
