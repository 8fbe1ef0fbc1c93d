#pragma once
// A long prompt through chunked prefill against the same prompt in one step (issue #35):
// the caches a chunk leaves (KDA state and conv windows, MLA latent rows) must be exactly
// what the next chunk continues from, and a chunk's attention must cover the whole cached
// prefix. Shared by tests/model/chunked_prefill_test.cpp (CPU) and tests/ops (CUDA).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "runtime/generate.h"

namespace moonrun::testing {

inline std::vector<int32_t> random_prompt(int n, int vocab, uint64_t seed) {
  std::vector<int32_t> ids(n);
  uint64_t h = seed;
  for (int32_t& id : ids) {
    h = h * 6364136223846793005ull + 1442695040888963407ull;
    id = static_cast<int32_t>((h >> 33) % static_cast<uint64_t>(vocab - 8));  // below the specials
  }
  return ids;
}

// One step, then each of `chunks`: the same greedy tokens, and every logit of the prompt's
// last position and the decoded ones within `tolerance` of the one-step run. The runner
// must take a step of the whole prompt (max_tokens_per_step).
inline void expect_chunked_prefill_matches(StepRunner& runner, int page_size_tokens, const std::vector<int32_t>& prompt,
                                           const std::vector<int>& chunks, int generated, float tolerance,
                                           const std::string& label) {
  auto run = [&](int chunk) {
    GenerateOptions opt;
    opt.max_tokens = generated;
    opt.keep_logits = true;
    opt.prefill_chunk_tokens = chunk;
    auto r = generate(runner, page_size_tokens, prompt, opt);
    EXPECT_TRUE(r.is_ok()) << r.status().to_string();
    return r.is_ok() ? std::move(r).value() : GenerateResult{};
  };
  const GenerateResult whole = run(0);
  ASSERT_FALSE(whole.logits.empty());
  for (const int chunk : chunks) {
    const GenerateResult chunked = run(chunk);
    ASSERT_EQ(chunked.logits.size(), whole.logits.size());
    EXPECT_EQ(chunked.token_ids, whole.token_ids) << label << ", chunks of " << chunk;
    float worst = 0, scale = 0;
    for (size_t i = 0; i < whole.logits.size(); ++i) {
      const float d = std::fabs(chunked.logits[i] - whole.logits[i]);
      if (!(d <= worst)) worst = d;  // also catches NaN
      scale = std::max(scale, std::fabs(whole.logits[i]));
    }
    std::printf("%s, %zu-token prompt in chunks of %d: max |dlogit| %.3g (logits up to %.3g), %.1f s one step\n",
                label.c_str(), prompt.size(), chunk, worst, scale, whole.prefill_seconds);
    EXPECT_LE(worst, tolerance) << label << ", chunks of " << chunk;
  }
}

}  // namespace moonrun::testing
