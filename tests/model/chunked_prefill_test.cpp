// A long prompt in chunks gives the one-step logits on the CPU backend (fp32): a
// 32,768-token prompt through a reference fixture's checkpoint in one step and in chunks of
// 512 and of 8,192 tokens (the server's default), then a few decoded tokens
// (support/chunked_prefill.h; tests/ops/model_cuda_test.cpp runs the same on CUDA).
#include <gtest/gtest.h>

#include "../support/chunked_prefill.h"
#include "../support/fixture_files.h"
#include "../support/runtimes.h"

namespace moonrun {
namespace {

constexpr int kPromptTokens = 32768;

TEST(ChunkedPrefill, LongPromptInChunksGivesTheOneStepLogits) {
  const std::string dir = fixtures::fixtures_dir() + "/k3-tiny-a";
  RuntimeOptions ro = testing::test_runtime_options("cpu", kPromptTokens + 64);
  ro.max_tokens_per_step = kPromptTokens;  // the one-step run
  ro.context_length = kPromptTokens + 64;
  Runtime rt = testing::make_runtime(dir, ro);
  ASSERT_TRUE(rt.runner);
  // fp32: chunking changes only where sums are cut (KDA's 64-token blocks line up with the
  // chunks, MLA sums each query over the same positions), so the runs agree to rounding.
  testing::expect_chunked_prefill_matches(*rt.runner, rt.cache.page_size_tokens,
                                          testing::random_prompt(kPromptTokens, rt.config.vocab_size, 42), {512, 8192},
                                          4, 1e-4f, "cpu fp32 k3-tiny-a");
}

}  // namespace
}  // namespace moonrun
