// The MoE block's CUDA kernels (kernels/cuda/moe) against the CPU reference
// (cpu::route_token, cpu::dequantize_mxfp4 + cpu::matmul_xwT, cpu::moe_forward), on the tiny
// fixtures' shapes (tests/fixtures/*/config.json) and K3's real widths
// (/work/shared/models/kimi-k3.config.json: hidden 7168, latent 3584, expert FFN 3072,
// 896 experts top-16 ungrouped, 2 shared experts).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <initializer_list>
#include <numeric>
#include <string>
#include <vector>

#include "backend/cpu/moe.h"
#include "backend/cpu/mxfp4.h"
#include "backend/cpu/router.h"
#include "backend/cuda/common/device_buffer.h"
#include "backend/cuda/moe/moe_internal.h"
#include "backend/cuda/moe/moe_layer.h"
#include "op_test_util.h"

namespace moonrun {
namespace {

using cuda::bf16;
using cuda::DeviceBuffer;
using optest::expect_close;
using optest::expect_exact;
using optest::normalised_error;

// A fast deterministic generator for the large K3-width weights (hundreds of millions of
// values: std::normal_distribution would take minutes on the CPU side).
struct FastRng {
  uint64_t s;
  explicit FastRng(uint64_t seed) : s(seed * 0x9E3779B97F4A7C15ull + 1) {}
  uint64_t next() {  // splitmix64
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  float uniform(float lo, float hi) { return lo + (hi - lo) * static_cast<float>(next() >> 40) * 0x1p-24f; }
};
std::vector<float> fast_uniform(size_t n, uint64_t seed, float lo, float hi) {
  FastRng r(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = r.uniform(lo, hi);
  return v;
}
std::vector<uint8_t> fast_bytes(size_t n, uint64_t seed, int lo = 0, int hi = 255) {
  FastRng r(seed);
  std::vector<uint8_t> v(n);
  if (lo == 0 && hi == 255) {  // the MXFP4 codes: eight bytes per draw (0.5 GB at K3 width)
    for (size_t i = 0; i < n; i += 8) {
      const uint64_t bits = r.next();
      for (size_t b = 0; b < 8 && i + b < n; ++b) v[i + b] = static_cast<uint8_t>(bits >> (8 * b));
    }
    return v;
  }
  for (auto& x : v) x = static_cast<uint8_t>(lo + static_cast<int>(r.next() % static_cast<uint64_t>(hi - lo + 1)));
  return v;
}
std::vector<float> to_floats(const std::vector<int32_t>& v) { return std::vector<float>(v.begin(), v.end()); }

// ---------------------------------------------------------------------------------------
// Router

// The smallest gap between two biased scores whose order the choice depends on: ranks
// 0..top_k of the (group-masked) scores, and group ranks topk_group-1 / topk_group. Where it
// is below the fp32 noise of the logits (~1e-6: GPU expf vs the CPU's, GEMM sum order), the
// CPU and GPU may legitimately pick differently; tests build inputs that stay clear of that.
float route_margin(const float* logits, const float* bias, const cpu::RouterParams& p) {
  const int E = p.num_experts;
  std::vector<float> c(E);
  for (int e = 0; e < E; ++e) c[e] = 1.0f / (1.0f + std::exp(-logits[e])) + (bias ? bias[e] : 0.0f);
  float margin = INFINITY;
  if (p.num_expert_group > 1 && p.num_expert_group > p.topk_group) {
    const int G = p.num_expert_group, per = E / G;
    std::vector<float> gs(G);
    for (int g = 0; g < G; ++g) {
      std::vector<float> v(c.begin() + g * per, c.begin() + (g + 1) * per);
      std::sort(v.rbegin(), v.rend());
      gs[g] = v[0] + (per > 1 ? v[1] : -INFINITY);
    }
    std::vector<int> order(G);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return gs[a] > gs[b]; });
    margin = std::min(margin, gs[order[p.topk_group - 1]] - gs[order[p.topk_group]]);
    std::vector<bool> keep(G, false);
    for (int i = 0; i < p.topk_group; ++i) keep[order[i]] = true;
    for (int e = 0; e < E; ++e)
      if (!keep[e / per]) c[e] = -INFINITY;
  }
  std::sort(c.rbegin(), c.rend());
  for (int k = 0; k < p.top_k && k + 1 < E; ++k)
    if (std::isfinite(c[k + 1])) margin = std::min(margin, c[k] - c[k + 1]);
  return margin;
}

struct RouterCase {
  const char* name;
  cpu::RouterParams p;
  bool bias;
  int n_tokens;
};

// Random logits, redrawn per token until every decision margin exceeds 1e-4 (100x the
// noise), so expert ids must match exactly; weights are compared to ~1e-6.
void check_router(const RouterCase& rc, uint64_t seed) {
  const int E = rc.p.num_experts, K = rc.p.top_k, n = rc.n_tokens;
  std::vector<float> bias = rc.bias ? optest::random_uniform(E, seed + 1, -0.05f, 0.05f) : std::vector<float>();
  const float* bias_ptr = rc.bias ? bias.data() : nullptr;
  std::vector<float> logits(static_cast<size_t>(n) * E);
  int redraws = 0;
  for (int t = 0; t < n; ++t) {
    for (uint64_t attempt = 0;; ++attempt) {
      auto row = optest::random_normal(E, seed * 1000003 + t * 101 + attempt, 1.5f);
      if (route_margin(row.data(), bias_ptr, rc.p) > 1e-4f) {
        std::copy(row.begin(), row.end(), logits.begin() + static_cast<size_t>(t) * E);
        break;
      }
      ++redraws;
    }
  }
  std::vector<int32_t> want_ids(static_cast<size_t>(n) * K);
  std::vector<float> want_w(want_ids.size());
  for (int t = 0; t < n; ++t) {
    std::vector<int> ids(K);
    cpu::route_token(&logits[static_cast<size_t>(t) * E], bias_ptr, rc.p, ids.data(),
                     &want_w[static_cast<size_t>(t) * K]);
    std::copy(ids.begin(), ids.end(), want_ids.begin() + static_cast<size_t>(t) * K);
  }
  DeviceBuffer<float> d_logits(logits), d_w(want_w.size());
  DeviceBuffer<float> d_bias = rc.bias ? DeviceBuffer<float>(bias) : DeviceBuffer<float>();
  DeviceBuffer<int32_t> d_ids(want_ids.size());
  cuda::router_topk(d_logits.data(), rc.bias ? d_bias.data() : nullptr, n, rc.p, d_ids.data(), d_w.data(), nullptr);
  CUDA_CHECK(cudaDeviceSynchronize());
  const std::string shape = std::string(rc.name) + "_E" + std::to_string(E) + "k" + std::to_string(K) + "t" +
                            std::to_string(n) + (rc.bias ? "_bias" : "");
  std::printf("router %s: %d logit rows redrawn for clear margins\n", shape.c_str(), redraws);
  expect_exact("router_topk.ids", shape, to_floats(d_ids.download()), to_floats(want_ids));
  // Weights: sigmoid via expf (GPU, <= 2 ulp) vs the CPU's exp, then the same renormalise and
  // scale: a few fp32 ulps of the scaled weight (routed_scaling_factor <= 2.5).
  expect_close("router_topk.weights", shape, normalised_error(d_w.download(), want_w), 2e-6);
}

cpu::RouterParams router_params(int E, int K, int G, int tg, float scale, bool renorm = true) {
  cpu::RouterParams p;
  p.num_experts = E;
  p.top_k = K;
  p.num_expert_group = G;
  p.topk_group = tg;
  p.routed_scaling_factor = scale;
  p.renormalize = renorm;
  return p;
}

TEST(MoeRouter, MatchesRouteToken) {
  REQUIRE_GPU();
  const RouterCase cases[] = {
      {"k3tinyA_grouped", router_params(16, 4, 4, 2, 2.5f), true, 70},   // tests/fixtures/k3-tiny-a
      {"k3tinyA_grouped", router_params(16, 4, 4, 2, 2.5f), false, 1},
      {"k3tinyB", router_params(8, 2, 1, 1, 1.0f), true, 70},            // k3-tiny-b
      {"kimiLinear", router_params(8, 2, 1, 1, 2.446f), false, 70},      // kimi-linear-tiny
      {"k3", router_params(896, 16, 1, 1, 1.0f), true, 1},               // K3: ungrouped
      {"k3", router_params(896, 16, 1, 1, 1.0f), true, 200},
      {"k3_grouped8of4", router_params(896, 16, 8, 4, 2.5f), true, 70},  // DeepSeek-V3-style groups
      {"k3_grouped32of3", router_params(896, 16, 32, 3, 1.5f), false, 70},  // 28 per group, G = 32
      {"top1", router_params(64, 1, 1, 1, 1.0f), true, 33},              // no renormalisation at k = 1
      {"norenorm", router_params(64, 6, 1, 1, 2.0f, false), true, 33},
      {"k_eq_E", router_params(8, 8, 1, 1, 1.0f), true, 5},
  };
  uint64_t seed = 11;
  for (const auto& rc : cases) check_router(rc, seed++);
}

// Grouping where masked groups leave fewer finite scores than top_k: the -inf experts are
// then taken in id order, as std::partial_sort does.
TEST(MoeRouter, MaskedExpertsFillInIdOrder) {
  REQUIRE_GPU();
  check_router({"masked_fill", router_params(16, 6, 4, 1, 1.0f), true, 9}, 99);
}

// ---------------------------------------------------------------------------------------
// The W4A16 GEMM

struct PackedMatrix {
  cpu::Mxfp4Matrix m;
  DeviceBuffer<uint8_t> codes, scales;
  cuda::DeviceExpertMatrix dev() const {
    cuda::DeviceExpertMatrix d;
    d.codes = codes.data();
    d.scales = scales.data();
    d.out_features = m.out_features;
    d.in_features = m.in_features;
    return d;
  }
  std::vector<float> dequantised() const {
    std::vector<float> w(static_cast<size_t>(m.out_features) * m.in_features);
    cpu::dequantize_mxfp4(m.codes.data(), m.scales.data(), m.out_features, m.in_features, w.data());
    return w;
  }
};
PackedMatrix make_packed(int out, int in, uint64_t seed, int scale_lo, int scale_hi) {
  PackedMatrix p;
  p.m.out_features = out;
  p.m.in_features = in;
  p.m.codes = fast_bytes(static_cast<size_t>(out) * in / 2, seed);  // every nibble value occurs
  p.m.scales = fast_bytes(static_cast<size_t>(out) * in / 32, seed + 7, scale_lo, scale_hi);
  p.codes = DeviceBuffer<uint8_t>(p.m.codes);
  p.scales = DeviceBuffer<uint8_t>(p.m.scales);
  return p;
}

std::vector<float> run_mxfp4(const PackedMatrix& w, const std::vector<float>& x, int n) {
  DeviceBuffer<bf16> d_x(cuda::to_bf16(x));
  DeviceBuffer<float> d_y(static_cast<size_t>(n) * w.m.out_features);
  cuda::mxfp4_linear(d_x.data(), n, w.dev(), d_y.data(), nullptr);
  CUDA_CHECK(cudaDeviceSynchronize());
  return d_y.download();
}

std::string mat_shape(int n, int out, int in) {
  return "t" + std::to_string(n) + "_" + std::to_string(out) + "x" + std::to_string(in);
}

// Small-integer activations, scales 2^-1..2^1: every product is a multiple of 1/4 below 48
// and every partial sum below 2^18, all exact in fp32, so any summation order gives the CPU's
// bits.
TEST(Mxfp4Linear, BitExactOnSmallIntegers) {
  REQUIRE_GPU();
  struct Shape {
    int n, out, in;
  };
  const Shape shapes[] = {{1, 32, 64}, {7, 64, 32}, {70, 128, 64}, {1, 3072, 3584}, {9, 3584, 3072}, {70, 3072, 3584}};
  uint64_t seed = 100;
  for (const auto& s : shapes) {
    const PackedMatrix w = make_packed(s.out, s.in, seed++, 126, 128);
    const auto x = optest::random_small_ints(static_cast<size_t>(s.n) * s.in, seed++, -4, 4);
    std::vector<float> want(static_cast<size_t>(s.n) * s.out);
    cpu::matmul_xwT(x.data(), s.n, s.in, w.dequantised().data(), s.out, want.data());
    expect_exact("mxfp4_linear.exact", mat_shape(s.n, s.out, s.in), run_mxfp4(w, x, s.n), want);
  }
}

// One-hot activations read single weights back: every code (16 nibbles, both positions) and
// every scale 0..252 (including the subnormal 2^-127) decodes to the CPU's value. Scales 253
// and 254 overflow fp32 for the large codes (6 * 2^126 > FLT_MAX), and the one-hot's zeros
// would then make inf * 0 = NaN in the dot product: IEEE, not the decode; real MXFP4
// weights sit near 2^-8.
TEST(Mxfp4Linear, DecodesEveryCodeAndScale) {
  REQUIRE_GPU();
  const int in = 64, out = 253;
  PackedMatrix w = make_packed(out, in, 7, 0, 252);
  for (int r = 0; r < out; ++r) w.m.scales[static_cast<size_t>(r) * 2] = static_cast<uint8_t>(r);  // every scale
  w.scales.upload(w.m.scales);
  std::vector<float> x(static_cast<size_t>(in) * in, 0.0f);  // token j = e_j
  for (int j = 0; j < in; ++j) x[static_cast<size_t>(j) * in + j] = 1.0f;
  const auto wd = w.dequantised();
  std::vector<float> want(static_cast<size_t>(in) * out);  // y[j, o] = W[o, j]
  for (int j = 0; j < in; ++j)
    for (int o = 0; o < out; ++o) want[static_cast<size_t>(j) * out + o] = wd[static_cast<size_t>(o) * in + j];
  expect_exact("mxfp4_linear.decode", mat_shape(in, out, in), run_mxfp4(w, x, in), want);
}

// Random bf16 activations and random codes/scales: the CPU sums in fp32 in another order, so
// the difference is fp32 reordering only, ~sqrt(in) * 2^-24 relative to the row's scale:
// < 1e-6 at in = 3584; 1e-5 leaves room without hiding a wrong element (one wrong weight in a
// row moves the result by ~1/sqrt(in) ~ 2e-2).
TEST(Mxfp4Linear, RandomMatchesDequantisedMatmul) {
  REQUIRE_GPU();
  struct Shape {
    int n, out, in;
  };
  const Shape shapes[] = {{1, 32, 32}, {70, 32, 64}, {3, 64, 128}, {1, 3072, 3584}, {70, 3072, 3584}, {16, 3584, 3072}};
  uint64_t seed = 200;
  for (const auto& s : shapes) {
    const PackedMatrix w = make_packed(s.out, s.in, seed++, 118, 124);
    const auto x = optest::bf16_rounded(optest::random_normal(static_cast<size_t>(s.n) * s.in, seed++));
    std::vector<float> want(static_cast<size_t>(s.n) * s.out);
    cpu::matmul_xwT(x.data(), s.n, s.in, w.dequantised().data(), s.out, want.data());
    expect_close("mxfp4_linear", mat_shape(s.n, s.out, s.in), normalised_error(run_mxfp4(w, x, s.n), want), 1e-5);
  }
}

// The bf16-weight twin (Kimi Linear's experts): same threshold, same reason.
TEST(Mxfp4Linear, Bf16ExpertLinearMatchesMatmul) {
  REQUIRE_GPU();
  const int n = 70, out = 96, in = 64;
  const auto w = optest::bf16_rounded(optest::random_normal(static_cast<size_t>(out) * in, 1));
  const auto x = optest::bf16_rounded(optest::random_normal(static_cast<size_t>(n) * in, 2));
  DeviceBuffer<bf16> d_w(cuda::to_bf16(w)), d_x(cuda::to_bf16(x));
  DeviceBuffer<float> d_y(static_cast<size_t>(n) * out);
  cuda::DeviceExpertMatrix m;
  m.w = d_w.data();
  m.out_features = out;
  m.in_features = in;
  cuda::bf16_expert_linear(d_x.data(), n, m, d_y.data(), nullptr);
  CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<float> want(static_cast<size_t>(n) * out);
  cpu::matmul_xwT(x.data(), n, in, w.data(), out, want.data());
  expect_close("bf16_expert_linear", mat_shape(n, out, in), normalised_error(d_y.download(), want), 1e-5);
}

// ---------------------------------------------------------------------------------------
// Grouping

// The slot lists are the CPU's: per expert, the slots (t*K + k) that chose it, ascending.
TEST(MoeGroups, StableCountingSortMatchesCpu) {
  REQUIRE_GPU();
  for (const auto& [E, n_slots] : {std::pair{8, 2}, std::pair{16, 280}, std::pair{896, 16}, std::pair{896, 3200},
                                   std::pair{32, 1120}}) {
    const auto idsf = optest::random_small_ints(n_slots, E + n_slots, 0, E - 1);
    std::vector<int32_t> ids(idsf.begin(), idsf.end());
    std::vector<int32_t> want_offsets(E + 1, 0), want_perm, want_active;
    for (int e = 0; e < E; ++e) {
      want_offsets[e] = static_cast<int32_t>(want_perm.size());
      for (int s = 0; s < n_slots; ++s)
        if (ids[s] == e) want_perm.push_back(s);
      if (static_cast<int>(want_perm.size()) > want_offsets[e]) want_active.push_back(e);
    }
    want_offsets[E] = n_slots;
    DeviceBuffer<int32_t> d_ids(ids), offsets(E + 1), perm(n_slots), active(E), num_active(1);
    cuda::ExpertGroups g{offsets.data(), perm.data(), active.data(), num_active.data()};
    cuda::group_by_expert(d_ids.data(), n_slots, E, g, nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
    const std::string shape = "E" + std::to_string(E) + "_slots" + std::to_string(n_slots);
    auto act = active.download();
    act.resize(num_active.download()[0]);
    expect_exact("group_by_expert.offsets", shape, to_floats(offsets.download()), to_floats(want_offsets));
    expect_exact("group_by_expert.perm", shape, to_floats(perm.download()), to_floats(want_perm));
    expect_exact("group_by_expert.active", shape, to_floats(act), to_floats(want_active));
  }
}

// ---------------------------------------------------------------------------------------
// The whole block

struct MoeCase {
  const char* name;
  int hidden, io_dim, num_experts, top_k, groups, topk_group, inter, shared_inter;
  float scale;
  bool situ, mxfp4, latent, latent_norm, bias;
};

cpu::Linear make_linear(int out, int in, uint64_t seed, bool round_to_bf16 = true) {
  cpu::Linear l;
  l.out_features = out;
  l.in_features = in;
  const float a = std::sqrt(3.0f / in);  // unit-variance outputs for unit-variance inputs
  l.w = fast_uniform(static_cast<size_t>(out) * in, seed, -a, a);
  if (round_to_bf16) l.w = optest::bf16_rounded(std::move(l.w));  // what upload_linear keeps
  return l;
}
cpu::MlpWeights make_mlp(int inter, int in, uint64_t seed) {
  cpu::MlpWeights m;
  m.gate = make_linear(inter, in, seed);
  m.up = make_linear(inter, in, seed + 1);
  m.down = make_linear(in, inter, seed + 2);
  return m;
}
// Random MXFP4 codes; E2M1 codes have rms 2.93, so scale 2^(s-127) ~ 1/(2.93 sqrt(in)) keeps
// unit-variance outputs.
cpu::Mxfp4Matrix make_mxfp4(int out, int in, uint64_t seed) {
  cpu::Mxfp4Matrix m;
  m.out_features = out;
  m.in_features = in;
  const int s = 127 - static_cast<int>(std::lround(std::log2(2.93 * std::sqrt(in))));
  m.codes = fast_bytes(static_cast<size_t>(out) * in / 2, seed);
  m.scales = fast_bytes(static_cast<size_t>(out) * in / 32, seed ^ 0x5ca1e5ull, s - 1, s + 1);
  return m;
}
cpu::Linear dequantised(const cpu::Mxfp4Matrix& m) {
  cpu::Linear l;
  l.out_features = m.out_features;
  l.in_features = m.in_features;
  l.w.resize(static_cast<size_t>(m.out_features) * m.in_features);
  cpu::dequantize_mxfp4(m.codes.data(), m.scales.data(), m.out_features, m.in_features, l.w.data());
  return l;
}

// Builds and uploads the weights once, then checks every token count.
void check_moe(const MoeCase& c, std::initializer_list<int> token_counts, uint64_t seed) {
  cpu::MoeDims dims;
  dims.hidden = c.hidden;
  dims.io_dim = c.latent ? c.io_dim : c.hidden;
  dims.router = router_params(c.num_experts, c.top_k, c.groups, c.topk_group, c.scale);
  dims.act.situ = c.situ;
  dims.norm_eps = 1e-5f;
  const int H = dims.hidden, D = dims.io_dim, E = c.num_experts;

  // CPU weights (the reference) hold exactly what the GPU holds: bf16-rounded dense weights,
  // the dequantised MXFP4 codes, the fp32 router.
  cpu::MoeWeights cw;  // reference (float experts)
  cpu::MoeWeights gw;  // what gets uploaded (packed experts when MXFP4)
  cw.router = make_linear(E, H, seed, /*round_to_bf16=*/false);
  for (auto& v : cw.router.w) v *= std::sqrt(3.0f);  // logits ~ N(0, 1) for x ~ U(-1, 1)
  if (c.bias) cw.router_bias = optest::random_uniform(E, seed + 1, -0.05f, 0.05f);
  for (int e = 0; e < E; ++e) {
    const uint64_t s = seed + 100 + 10 * e;
    if (c.mxfp4) {
      cpu::PackedExpert p{make_mxfp4(c.inter, D, s), make_mxfp4(c.inter, D, s + 1), make_mxfp4(D, c.inter, s + 2)};
      cw.experts.push_back({dequantised(p.gate), dequantised(p.up), dequantised(p.down)});
      gw.packed_experts.push_back(std::move(p));
    } else {
      cw.experts.push_back(make_mlp(c.inter, D, s));
    }
  }
  if (c.shared_inter > 0) cw.shared = make_mlp(c.shared_inter, H, seed + 20);
  if (c.latent) {
    cw.latent_down = make_linear(D, H, seed + 30);
    cw.latent_up = make_linear(H, D, seed + 31);
    if (c.latent_norm) cw.latent_norm = optest::random_uniform(D, seed + 32, 0.5f, 1.5f);
  }
  gw.router = cw.router;
  gw.router_bias = cw.router_bias;
  if (!c.mxfp4) gw.experts = cw.experts;
  gw.shared = cw.shared;
  gw.latent_down = cw.latent_down;
  gw.latent_up = cw.latent_up;
  gw.latent_norm = cw.latent_norm;

  cuda::DeviceArena arena(size_t{3} << 30);
  const cuda::DeviceMoeWeights dw = cuda::upload_moe(arena, gw);
  EXPECT_EQ(dw.mxfp4, c.mxfp4);

  for (const int n_tokens : token_counts) {
    // x: bf16-exact (the GPU's router reads the fp32 copy, the projections the bf16 one; both
    // hold the same values), each row redrawn until its routing margins are clear.
    std::vector<float> x(static_cast<size_t>(n_tokens) * H), logits(E);
    int redraws = 0;
    for (int t = 0; t < n_tokens; ++t) {
      for (uint64_t attempt = 0;; ++attempt) {
        const auto row = optest::bf16_rounded(fast_uniform(H, seed * 7919 + t * 131 + attempt, -1.0f, 1.0f));
        cpu::matmul_xwT(row.data(), 1, H, cw.router.w.data(), E, logits.data());
        if (route_margin(logits.data(), c.bias ? cw.router_bias.data() : nullptr, dims.router) > 1e-4f) {
          std::copy(row.begin(), row.end(), x.begin() + static_cast<size_t>(t) * H);
          break;
        }
        ++redraws;
      }
    }
    std::vector<float> want(static_cast<size_t>(n_tokens) * H);
    cpu::moe_forward(cw, dims, x.data(), n_tokens, want.data());

    cudaStream_t stream;
    CUDA_CHECK(cudaStreamCreate(&stream));
    cudaEvent_t start, stop;
    CUDA_CHECK(cudaEventCreate(&start));
    CUDA_CHECK(cudaEventCreate(&stop));
    std::vector<float> got, again;
    float ms = 0;  // the second (warm) call's GPU time
    {
      cuda::Blas blas(stream);
      DeviceBuffer<float> d_x(x), d_out(want.size());
      DeviceBuffer<bf16> d_xb(cuda::to_bf16(x));
      for (auto* result : {&got, &again}) {
        cuda::Scratch scratch(arena);
        CUDA_CHECK(cudaEventRecord(start, stream));
        cuda::moe_forward(blas, dw, dims, d_x.data(), d_xb.data(), n_tokens, d_out.data(), scratch);
        CUDA_CHECK(cudaEventRecord(stop, stream));
        CUDA_CHECK(cudaStreamSynchronize(stream));
        CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
        *result = d_out.download();
      }
    }
    CUDA_CHECK(cudaEventDestroy(start));
    CUDA_CHECK(cudaEventDestroy(stop));
    CUDA_CHECK(cudaStreamDestroy(stream));

    const std::string shape = std::string(c.name) + "_t" + std::to_string(n_tokens);
    std::printf("moe %s: %d x rows redrawn for clear routing margins; moe_forward %.3f ms\n", shape.c_str(),
                redraws, ms);
    // The GPU rounds to bf16 where the CPU stays fp32: z (latent input), the activation h, the
    // normalised y before latent_up, the shared MLP's activation. Each is 2^-9 relative per
    // element and they average down inside the following dot products; the routing is
    // identical (clear margins) and the GEMMs accumulate in fp32. Measured ~1e-3 (see
    // the OPERR lines); 1e-2 = 5 x 2^-9 flags any wrong expert, weight or row (those are O(1)).
    expect_close("moe_forward", shape, normalised_error(got, want), 1e-2);
    expect_exact("moe_forward.deterministic", shape, again, got);
  }
}

// Shapes: the fixtures' MoE blocks and K3's widths with fewer experts (the CPU reference
// must dequantise and hold every expert: 32 x 3 x 11M floats at K3 width).
const MoeCase kTinyA{"k3tinyA", 64, 32, 16, 4, 4, 2, 32, 32, 2.5f, true, true, true, true, true};
const MoeCase kTinyB{"k3tinyB", 128, 64, 8, 2, 1, 1, 64, 128, 1.0f, true, true, true, true, true};
const MoeCase kKimiLinear{"kimiLinearTiny", 64, 64, 8, 2, 1, 1, 32, 32, 2.446f, false, false, false, false, true};
const MoeCase kK3Width{"k3width_E32", 7168, 3584, 32, 16, 1, 1, 3072, 6144, 1.0f, true, true, true, true, true};

TEST(MoeForward, TinyFixtures) {
  REQUIRE_GPU();
  check_moe(kTinyA, {1, 70}, 1);
  check_moe(kTinyB, {1, 70}, 2);
  check_moe(kKimiLinear, {1, 70}, 3);
}

// The variants the fixtures do not cover: no shared experts, latent without the norm, bf16
// experts in a latent block, MXFP4 without latent, no router bias.
TEST(MoeForward, Variants) {
  REQUIRE_GPU();
  MoeCase no_shared = kTinyA;
  no_shared.name = "tinyA_noShared_noBias";
  no_shared.shared_inter = 0;
  no_shared.bias = false;
  MoeCase no_norm = kTinyB;
  no_norm.name = "tinyB_latentNoNorm";
  no_norm.latent_norm = false;
  MoeCase bf16_latent = kTinyA;
  bf16_latent.name = "tinyA_bf16Experts";
  bf16_latent.mxfp4 = false;
  MoeCase mx_plain = kKimiLinear;
  mx_plain.name = "kimiLinear_mxfp4";
  mx_plain.mxfp4 = true;
  for (const auto& c : {no_shared, no_norm, bf16_latent, mx_plain}) check_moe(c, {70}, 4);
}

TEST(MoeForward, K3Widths) {
  REQUIRE_GPU();
  check_moe(kK3Width, {1, 70}, 5);
}

}  // namespace
}  // namespace moonrun
