// INT4 pack-quantized experts (issue 40) on the CPU: the unpack against words written by hand
// from compressed-tensors' format definition (cpu/int4.h cites the code it was confirmed
// against), and CpuOps::moe_experts over INT4 matrices equal to the same experts held
// dequantised in F32.
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/int4.h"
#include "common/dtype.h"

namespace moonrun {
namespace {

using cpu::dequantize_int4_g32;
using cpu::int4_value;
using cpu::CpuOps;

TEST(Int4, HandWrittenWords) {
  // u4 = q + 8, element i at bits 4i..4i+3: 0x76543210 holds u = 0..7, i.e. q = -8..-1;
  // 0xFEDCBA98 holds u = 8..15, q = 0..7; 0x88888888 is eight zeros.
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(int4_value(0x76543210u, i), i - 8) << i;
    EXPECT_EQ(int4_value(0xFEDCBA98u, i), i) << i;
    EXPECT_EQ(int4_value(0x88888888u, i), 0) << i;
  }
  // One row of 64 (two groups): scales 0.5 and -2 as bf16 (0x3F00, 0xC000).
  const uint32_t words[8] = {0x76543210u, 0xFEDCBA98u, 0x88888888u, 0x0000000Fu,
                             0x9u << 28, 0x88888889u, 0x88888888u, 0x88888888u};
  const uint16_t scales[2] = {0x3F00, 0xC000};
  std::vector<float> out(64);
  dequantize_int4_g32(words, scales, 1, 64, out.data());
  for (int i = 0; i < 8; ++i) EXPECT_EQ(out[i], 0.5f * (i - 8)) << i;       // -4 .. -0.5
  for (int i = 0; i < 8; ++i) EXPECT_EQ(out[8 + i], 0.5f * i) << i;        // 0 .. 3.5
  for (int i = 16; i < 24; ++i) EXPECT_EQ(out[i], 0.0f) << i;
  EXPECT_EQ(out[24], 3.5f);   // 0xF -> q = 7
  for (int i = 25; i < 32; ++i) EXPECT_EQ(out[i], -4.0f) << i;  // 0x0 -> q = -8
  // Second group, scale -2: word 0x90000000 has u = 9 (q = 1) in its top nibble, 0 (q = -8) below.
  for (int i = 32; i < 39; ++i) EXPECT_EQ(out[i], 16.0f) << i;
  EXPECT_EQ(out[39], -2.0f);
  EXPECT_EQ(out[40], -2.0f);  // 0x88888889: element 0 is u = 9
  for (int i = 41; i < 64; ++i) EXPECT_EQ(out[i], -0.0f) << i;
}

// Random codes and scales over every expert: the INT4 path of moe_experts equals the F32
// path over the dequantised weights, bit for bit (same values, same arithmetic).
TEST(Int4, MoeExpertsEqualTheDequantisedF32Experts) {
  CpuOps ops;
  const int E = 4, D = 64, I = 32, T = 5, K = 2;
  std::mt19937 rng(40);
  auto make = [&](int out, int in, ExpertMatrices& q, ExpertMatrices& f) {
    std::vector<uint32_t> w(static_cast<size_t>(E) * out * in / 8);
    std::vector<uint16_t> s(static_cast<size_t>(E) * out * in / 32);
    for (auto& x : w) x = static_cast<uint32_t>(rng());
    for (auto& x : s) x = f32_to_bf16(std::ldexp(1.0f + (rng() % 100) / 100.0f, -(static_cast<int>(rng() % 4)) - 4));
    std::vector<float> deq(static_cast<size_t>(E) * out * in);
    dequantize_int4_g32(w.data(), s.data(), E * out, in, deq.data());
    q.num_experts = f.num_experts = E;
    q.stacked.out = f.stacked.out = out;
    q.stacked.in = f.stacked.in = in;
    q.stacked.format = WeightFormat::int4_g32_sym;
    q.stacked.w = ops.alloc(static_cast<int64_t>(E) * out, in / 8, DType::I32, "w");
    q.stacked.scales = ops.alloc(static_cast<int64_t>(E) * out, in / 32, DType::BF16, "s");
    ops.upload(q.stacked.w, 0, w.data(), w.size() * 4);
    ops.upload(q.stacked.scales, 0, s.data(), s.size() * 2);
    f.stacked.w = ops.alloc(static_cast<int64_t>(E) * out, in, DType::F32, "f");
    ops.upload(f.stacked.w, 0, deq.data(), deq.size() * 4);
    EXPECT_TRUE(q.stacked.int4());
    EXPECT_FALSE(q.stacked.mxfp4());
  };
  ExpertMatrices q1, q3, q2, f1, f3, f2;
  make(I, D, q1, f1);
  make(I, D, q3, f3);
  make(D, I, q2, f2);
  Tensor x = ops.alloc(T, D, DType::F32, "x"), ids = ops.alloc(T, K, DType::I32, "ids");
  Tensor wts = ops.alloc(T, K, DType::F32, "wts");
  for (int i = 0; i < T * D; ++i) x.as<float>()[i] = static_cast<float>(rng() % 2001) / 1000.0f - 1.0f;
  for (int t = 0; t < T; ++t)
    for (int k = 0; k < K; ++k) {
      ids.as<int32_t>()[t * K + k] = (t + 3 * k) % E;
      wts.as<float>()[t * K + k] = 0.25f + 0.5f * k;
    }
  ActivationParams act;
  act.situ = false;  // SwiGLU, as K2
  Tensor yq = ops.alloc(T, D, DType::F32, "yq"), yf = ops.alloc(T, D, DType::F32, "yf");
  ops.moe_experts(x, ids, wts, q1, q3, q2, act, yq);
  ops.moe_experts(x, ids, wts, f1, f3, f2, act, yf);
  double norm = 0;
  for (int i = 0; i < T * D; ++i) {
    ASSERT_EQ(yq.as<float>()[i], yf.as<float>()[i]) << i;
    norm += std::abs(yf.as<float>()[i]);
  }
  EXPECT_GT(norm, 0.0);
}

}  // namespace
}  // namespace moonrun
