// Blas (cuBLASLt) against cpu::matmul_xwT: y[T, out] = x[T, in] W[out, in]^T.
// Shapes (T x in x out): odd tiny ones (1x1x1, 1x7x3, 3x17x5, 5x129x257), a prefill-like
// 130x1024x1000, a misaligned x (offset by one bf16), and K3's real projections: shared
// expert 7168->6144 and 6144->7168, latent MoE 7168->3584 and 3584->7168, the dense FFN
// 7168->33792 and 33792->7168, the lm_head 7168->163840 (a few tokens), and the fp32
// router 7168->896; the decode sizes (1..8 tokens) that take the skinny tensor-core kernel,
// printed beside cuBLASLt on the same shape, and the batched call over one input.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <cstdio>
#include <vector>

#include "backend/cpu/linear.h"
#include "backend/cuda/common/device_buffer.h"
#include "backend/cuda/gemm/blas.h"
#include "backend/cuda/gemm/skinny_gemm.h"
#include "op_test_util.h"
#include "core_inputs.h"

namespace moonrun::cuda {
namespace {

using optest::expect_close;
using optest::expect_exact;
using optest::fast_small_ints;
using optest::fast_uniform;
using optest::normalised_error;
using optest::shape_str;

// Both sides compute the same fp32 dot products of bf16 values (every product exact in
// fp32); only the summation order differs (the CPU: four interleaved partial sums; cuBLASLt:
// its tiles and split-K). Each order's rounding error is about sqrt(in) * 2^-24 of the row's
// magnitude, i.e. ~1e-5 at in = 33792 in the worst rows; measured values are ~1e-6.
constexpr double kF32OutThreshold = 2e-5;
// A bf16 output adds one rounding: bf16 keeps 8 significant bits, so round-to-nearest moves
// a value by at most 2^-8 of it (<= 2^-8 of the largest).
constexpr double kBf16OutThreshold = 0x1.0p-8 + kF32OutThreshold;

struct Case {
  int n_tokens, in, out;
  int x_offset = 0;  // elements: a misaligned x pointer (the alignment the heuristic is told)
};

// Runs one random case through both outputs and checks them against the CPU.
void check_random(Blas& blas, const Case& c, uint64_t seed) {
  const std::string shape = shape_str({c.n_tokens, c.in, c.out}) + (c.x_offset ? "+off" : "");
  std::printf("gemm shape T x in x out = %s\n", shape.c_str());
  // Inputs as bf16 holds them, so the CPU reference sees exactly what the GPU does.
  const auto x = fast_uniform(static_cast<size_t>(c.n_tokens) * c.in, seed, -1.0f, 1.0f, true);
  const auto w = fast_uniform(static_cast<size_t>(c.out) * c.in, seed + 1, -1.0f, 1.0f, true);
  std::vector<float> want(static_cast<size_t>(c.n_tokens) * c.out);
  cpu::matmul_xwT(x.data(), c.n_tokens, c.in, w.data(), c.out, want.data());

  std::vector<bf16> x_host(c.x_offset);
  const auto xb = optest::to_bf16_parallel(x);
  x_host.insert(x_host.end(), xb.begin(), xb.end());
  DeviceBuffer<bf16> d_x(x_host), d_w(optest::to_bf16_parallel(w));
  DeviceBuffer<float> d_y32(want.size());
  DeviceBuffer<bf16> d_y16(want.size());
  const DeviceLinear lin{d_w.data(), c.out, c.in};
  const auto t0 = std::chrono::steady_clock::now();
  blas.linear(d_x.data() + c.x_offset, c.n_tokens, lin, d_y32.data());
  CUDA_CHECK(cudaStreamSynchronize(blas.stream()));
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  blas.linear(d_x.data() + c.x_offset, c.n_tokens, lin, d_y16.data());
  CUDA_CHECK(cudaStreamSynchronize(blas.stream()));
  std::printf("gemm %s: first call (with plan) %.2f ms\n", shape.c_str(), ms);
  if (static_cast<int64_t>(c.in) * c.out >= (int64_t{1} << 24)) {
    // Steady state (plan cached) at K3 sizes: decode streams the weights once per call.
    cudaEvent_t start, stop;
    CUDA_CHECK(cudaEventCreate(&start));
    CUDA_CHECK(cudaEventCreate(&stop));
    constexpr int kReps = 5;
    CUDA_CHECK(cudaEventRecord(start, blas.stream()));
    for (int r = 0; r < kReps; ++r) blas.linear(d_x.data() + c.x_offset, c.n_tokens, lin, d_y32.data());
    CUDA_CHECK(cudaEventRecord(stop, blas.stream()));
    CUDA_CHECK(cudaEventSynchronize(stop));
    float total_ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&total_ms, start, stop));
    const double per_ms = total_ms / kReps;
    std::printf("gemm %s: %.3f ms per call, %.0f GB/s of bf16 weights\n", shape.c_str(), per_ms,
                2.0 * c.in * c.out / (per_ms * 1e6));
    if (skinny_linear_supported(d_x.data() + c.x_offset, c.n_tokens, d_w.data(), c.out, c.in)) {
      // The same shape through cuBLASLt, for the side-by-side (docs/performance.md).
      blas.set_skinny(false);
      blas.linear(d_x.data() + c.x_offset, c.n_tokens, lin, d_y32.data());
      CUDA_CHECK(cudaEventRecord(start, blas.stream()));
      for (int r = 0; r < kReps; ++r) blas.linear(d_x.data() + c.x_offset, c.n_tokens, lin, d_y32.data());
      CUDA_CHECK(cudaEventRecord(stop, blas.stream()));
      CUDA_CHECK(cudaEventSynchronize(stop));
      blas.set_skinny(true);
      CUDA_CHECK(cudaEventElapsedTime(&total_ms, start, stop));
      std::printf("gemm %s: skinny kernel %.0f GB/s, cuBLASLt %.0f GB/s\n", shape.c_str(),
                  2.0 * c.in * c.out / (per_ms * 1e6), 2.0 * c.in * c.out / (total_ms / kReps * 1e6));
      blas.linear(d_x.data() + c.x_offset, c.n_tokens, lin, d_y32.data());  // the skinny result, checked below
    }
    CUDA_CHECK(cudaEventDestroy(start));
    CUDA_CHECK(cudaEventDestroy(stop));
  }
  expect_close("gemm_bf16_f32out", shape, normalised_error(d_y32.download(), want), kF32OutThreshold);
  expect_close("gemm_bf16_bf16out", shape, normalised_error(to_float(d_y16.download()), want), kBf16OutThreshold);
}

// Small integers: every product and every partial sum (|sum| <= 9 * in < 2^24) is exact in
// fp32 in any order, so the GPU must equal the CPU bit for bit, and the bf16 output must be
// the CPU's sum rounded once.
void check_exact(Blas& blas, const Case& c, uint64_t seed) {
  const std::string shape = shape_str({c.n_tokens, c.in, c.out});
  std::printf("gemm exact shape T x in x out = %s\n", shape.c_str());
  const auto x = fast_small_ints(static_cast<size_t>(c.n_tokens) * c.in, seed, -3, 3);
  const auto w = fast_small_ints(static_cast<size_t>(c.out) * c.in, seed + 1, -3, 3);
  std::vector<float> want(static_cast<size_t>(c.n_tokens) * c.out);
  cpu::matmul_xwT(x.data(), c.n_tokens, c.in, w.data(), c.out, want.data());
  DeviceBuffer<bf16> d_x(to_bf16(x)), d_w(to_bf16(w));
  DeviceBuffer<float> d_y32(want.size());
  DeviceBuffer<bf16> d_y16(want.size());
  const DeviceLinear lin{d_w.data(), c.out, c.in};
  blas.linear(d_x.data(), c.n_tokens, lin, d_y32.data());
  blas.linear(d_x.data(), c.n_tokens, lin, d_y16.data());
  CUDA_CHECK(cudaStreamSynchronize(blas.stream()));
  expect_exact("gemm_exact_f32out", shape, d_y32.download(), want);
  expect_exact("gemm_exact_bf16out", shape, to_float(d_y16.download()), optest::bf16_rounded(want));
}

class GemmTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (device_count() == 0) GTEST_SKIP() << "no CUDA device";
    CUDA_CHECK(cudaStreamCreate(&stream_));
    blas_ = std::make_unique<Blas>(stream_);
  }
  void TearDown() override {
    blas_.reset();
    if (stream_) cudaStreamDestroy(stream_);
  }
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<Blas> blas_;
};

TEST_F(GemmTest, SmallAndOddShapes) {
  REQUIRE_GPU();
  for (const Case& c : {Case{1, 1, 1}, Case{1, 7, 3}, Case{3, 17, 5}, Case{5, 129, 257}, Case{130, 1024, 1000},
                        Case{3, 17, 5, 1}, Case{4, 64, 96, 1}})
    check_random(*blas_, c, 100 + c.in);
}

TEST_F(GemmTest, K3SharedExpertAndLatent) {
  REQUIRE_GPU();
  for (const Case& c : {Case{1, 7168, 6144}, Case{7, 6144, 7168}, Case{3, 7168, 3584}, Case{3, 3584, 7168}})
    check_random(*blas_, c, 200 + c.out);
}

TEST_F(GemmTest, K3DenseFfn) {
  REQUIRE_GPU();
  for (const Case& c : {Case{2, 7168, 33792}, Case{2, 33792, 7168}}) check_random(*blas_, c, 300 + c.out);
}

// Decode sizes (1..8 tokens) take the skinny tensor-core kernel where the shape allows:
// K3's KDA / MLA output projections 12288 -> 7168 and the MLA q_b 1536 -> 18432 (the shapes
// above take it too), at every token count it serves; 9 tokens go to cuBLASLt.
TEST_F(GemmTest, K3DecodeSizes) {
  REQUIRE_GPU();
  for (const Case& c : {Case{1, 12288, 7168}, Case{8, 12288, 7168}, Case{5, 1536, 18432}, Case{9, 1536, 18432}})
    check_random(*blas_, c, 600 + c.n_tokens);
}

// Several matrices of one input in one call (KDA's q, k, v and gate at decode): each output
// against the CPU, through the skinny kernel (1 and 6 tokens) and through cuBLASLt's strided
// batch (12 tokens).
TEST_F(GemmTest, BatchedSharedInput) {
  REQUIRE_GPU();
  const int in = 7168, out = 12288 / 4, batch = 4;
  for (const int T : {1, 6, 12}) {
    const auto x = fast_uniform(static_cast<size_t>(T) * in, 700 + T, -1.0f, 1.0f, true);
    const auto w = fast_uniform(static_cast<size_t>(batch) * out * in, 710 + T, -1.0f, 1.0f, true);
    DeviceBuffer<bf16> d_x(optest::to_bf16_parallel(x)), d_w(optest::to_bf16_parallel(w));
    DeviceBuffer<float> d_y(static_cast<size_t>(batch) * T * out);
    blas_->linear_batched(d_x.data(), T, DeviceLinear{d_w.data(), out, in}, batch, d_y.data());
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    const std::vector<float> got = d_y.download();
    for (int b = 0; b < batch; ++b) {
      std::vector<float> want(static_cast<size_t>(T) * out);
      cpu::matmul_xwT(x.data(), T, in, w.data() + static_cast<size_t>(b) * out * in, out, want.data());
      const std::vector<float> mine(got.begin() + static_cast<size_t>(b) * T * out,
                                    got.begin() + static_cast<size_t>(b + 1) * T * out);
      expect_close("gemm_batched_f32out", shape_str({T, in, out}) + "_" + std::to_string(b),
                   normalised_error(mine, want), kF32OutThreshold);
    }
  }
}

TEST_F(GemmTest, K3LmHead) {
  REQUIRE_GPU();
  check_random(*blas_, Case{3, 7168, 163840}, 400);
}

TEST_F(GemmTest, ExactOnSmallIntegers) {
  REQUIRE_GPU();
  for (const Case& c : {Case{1, 1, 1}, Case{3, 17, 5}, Case{1, 7168, 6144}, Case{9, 6144, 7168}, Case{2, 7168, 3584}})
    check_exact(*blas_, c, 500 + c.in);
}

// Zero tokens launch nothing: an output buffer filled with a sentinel keeps it.
TEST_F(GemmTest, ZeroTokensIsANoOp) {
  REQUIRE_GPU();
  DeviceBuffer<bf16> d_w(std::vector<bf16>(12, __float2bfloat16_rn(1.0f)));
  DeviceBuffer<bf16> d_x(std::vector<bf16>(4, __float2bfloat16_rn(1.0f)));
  DeviceBuffer<float> d_y(std::vector<float>(3, 42.0f));
  blas_->linear(d_x.data(), 0, DeviceLinear{d_w.data(), 3, 4}, d_y.data());
  CUDA_CHECK(cudaStreamSynchronize(stream_));
  EXPECT_EQ(d_y.download(), std::vector<float>(3, 42.0f));
  // The same call with one token does write: the sentinel check can fail.
  blas_->linear(d_x.data(), 1, DeviceLinear{d_w.data(), 3, 4}, d_y.data());
  CUDA_CHECK(cudaStreamSynchronize(stream_));
  EXPECT_EQ(d_y.download(), std::vector<float>(3, 4.0f));
}

TEST_F(GemmTest, LinearF32RouterShapes) {
  REQUIRE_GPU();
  for (const Case& c : {Case{1, 7168, 896}, Case{33, 7168, 896}, Case{3, 5, 7}, Case{1, 1, 1}}) {
    const std::string shape = shape_str({c.n_tokens, c.in, c.out});
    std::printf("linear_f32 shape T x in x out = %s\n", shape.c_str());
    const auto x = fast_uniform(static_cast<size_t>(c.n_tokens) * c.in, 700 + c.in, -1.0f, 1.0f);
    const auto w = fast_uniform(static_cast<size_t>(c.out) * c.in, 701 + c.in, -1.0f, 1.0f);
    std::vector<float> want(static_cast<size_t>(c.n_tokens) * c.out);
    cpu::matmul_xwT(x.data(), c.n_tokens, c.in, w.data(), c.out, want.data());
    DeviceBuffer<float> d_x(x), d_w(w), d_y(want.size());
    blas_->linear_f32(d_x.data(), c.n_tokens, d_w.data(), c.out, c.in, d_y.data());
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    expect_close("linear_f32", shape, normalised_error(d_y.download(), want), kF32OutThreshold);
  }
}

// TF32 keeps 10 mantissa bits: 1 + 2^-20 would become 1. Summed 64 times against w = 1 the
// exact answer 64 + 2^-14 is representable in fp32, so any TF32 rounding shows as a mismatch.
TEST_F(GemmTest, LinearF32IsNotTf32) {
  REQUIRE_GPU();
  std::printf("linear_f32 tf32 probe shape T x in x out = 2x64x3\n");
  const int n_tokens = 2, in = 64, out = 3;
  std::vector<float> x(n_tokens * in, 1.0f + 0x1.0p-20f), w(out * in, 1.0f);
  std::vector<float> want(n_tokens * out);
  cpu::matmul_xwT(x.data(), n_tokens, in, w.data(), out, want.data());
  ASSERT_EQ(want[0], 64.0f + 0x1.0p-14f);
  DeviceBuffer<float> d_x(x), d_w(w), d_y(want.size());
  blas_->linear_f32(d_x.data(), n_tokens, d_w.data(), out, in, d_y.data());
  CUDA_CHECK(cudaStreamSynchronize(stream_));
  expect_exact("linear_f32_no_tf32", "2x64x3", d_y.download(), want);
}

TEST_F(GemmTest, ExactF32OnSmallIntegers) {
  REQUIRE_GPU();
  std::printf("linear_f32 exact shape T x in x out = 5x7168x896\n");
  const auto x = fast_small_ints(5 * 7168, 800, -3, 3);
  const auto w = fast_small_ints(896 * 7168, 801, -3, 3);
  std::vector<float> want(5 * 896);
  cpu::matmul_xwT(x.data(), 5, 7168, w.data(), 896, want.data());
  DeviceBuffer<float> d_x(x), d_w(w), d_y(want.size());
  blas_->linear_f32(d_x.data(), 5, d_w.data(), 896, 7168, d_y.data());
  CUDA_CHECK(cudaStreamSynchronize(stream_));
  expect_exact("linear_f32_exact", "5x7168x896", d_y.download(), want);
}

}  // namespace
}  // namespace moonrun::cuda
