// Tensor and expert parallelism on real GPUs (one rank a GPU, NCCL between them, the ranks
// as threads of this process): every fixture under every two-GPU split its shapes allow is
// held to the same contracts as one GPU (fixture_contracts.h): in fp32 the reference's greedy
// ids and every logit within the fixture's tolerance, in bf16 the fixture's bf16 contract.
// The splits are tests/model/parallel_test.cpp's (the CPU ranks' test): TP 2 alone splits
// each expert, EP 2 splits the experts. Skipped on a machine with fewer than two GPUs
// (issue #19 runs it on nvidia-h200-x2: scripts/gpu-check.sh --part parallel).
#include <algorithm>
#include <ostream>
#include <string>

#include <gtest/gtest.h>

#include "../support/fixture_files.h"
#include "../support/runtimes.h"
#include "fixture_contracts.h"
#include "op_test_util.h"

namespace moonrun {
namespace {

struct Split {
  const char* fixture;
  int tp, ep;
  std::string label() const {
    return std::string(fixture) + " tp" + std::to_string(tp) + " ep" + std::to_string(ep);
  }
};
// gtest prints a parameter in the test's listing (and ctest's test names): the label, not
// the struct's bytes.
void PrintTo(const Split& sp, std::ostream* os) { *os << sp.label(); }

#define REQUIRE_GPUS(n)                                                                              \
  do {                                                                                               \
    if (::moonrun::cuda::device_count() < (n))                                                       \
      GTEST_SKIP() << (n) << " GPUs needed, " << ::moonrun::cuda::device_count() << " visible";      \
  } while (0)

RuntimeOptions split_options(const Split& sp, const char* dtype) {
  RuntimeOptions ro = testing::test_runtime_options("cuda", 256);
  ro.mem_fraction_static = 0.2;
  ro.dtype = dtype;
  ro.tp_size = sp.tp;
  ro.ep_size = sp.ep;
  return ro;
}

class ParallelCudaFixture : public ::testing::TestWithParam<Split> {};

TEST_P(ParallelCudaFixture, Float32GreedyIdsAndLogitsMatchTheReference) {
  const Split sp = GetParam();
  REQUIRE_GPUS(sp.tp);
  const std::string dir = fixtures::fixtures_dir() + "/" + sp.fixture;
  Runtime rt = testing::make_runtime(dir, split_options(sp, "float32"));
  ASSERT_TRUE(rt.runner);
  testing::expect_fp32_contract(*rt.runner, rt.cache.page_size_tokens, dir, sp.label());
}

TEST_P(ParallelCudaFixture, Bf16WithinTheFixturesBf16Contract) {
  const Split sp = GetParam();
  REQUIRE_GPUS(sp.tp);
  const std::string dir = fixtures::fixtures_dir() + "/" + sp.fixture;
  Runtime rt = testing::make_runtime(dir, split_options(sp, "auto"));
  ASSERT_TRUE(rt.runner);
  testing::expect_bf16_contract(*rt.runner, rt.cache.page_size_tokens, rt.config.vocab_size, dir, sp.label());
}

INSTANTIATE_TEST_SUITE_P(TwoGpus, ParallelCudaFixture,
                         ::testing::Values(Split{"k3-tiny-a", 2, 2}, Split{"k3-tiny-b", 2, 1}, Split{"k3-tiny-b", 2, 2},
                                           Split{"kimi-linear-tiny", 2, 1}, Split{"kimi-linear-tiny", 2, 2}),
                         [](const auto& info) {
                           std::string n = info.param.label();
                           std::replace(n.begin(), n.end(), '-', '_');
                           std::replace(n.begin(), n.end(), ' ', '_');
                           return n;
                         });

}  // namespace
}  // namespace moonrun
