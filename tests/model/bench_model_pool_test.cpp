// bench-model against pools too small for some rows (issue #38: 8 sequences of 1M tokens on
// an 80 GB H100 stopped mid-bench with "KV page ... is not in the pool"): each row's pages
// are counted before its steps are built, a row that does not fit is skipped with a line
// naming it, its pages and the pool's, and the rows that fit still run. Here the pool is
// capped by --max-total-tokens on the CPU backend, on k3-tiny-a (MLA pages and KDA state).
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "../support/fixture_files.h"
#include "tools/bench_model.h"

namespace moonrun {
namespace {

// Context 20 and 1 warm-up + 2 timed + 1 profiled steps (+ 1, + k drafts): 25 or 26 tokens
// a sequence, 2 pages of 16; the pool is capped at 3 pages.
tools::ModelBenchConfig small_pool_bench() {
  tools::ModelBenchConfig c;
  c.model = fixtures::fixtures_dir() + "/k3-tiny-a";
  c.runtime.device = "cpu";
  c.runtime.log = false;
  c.runtime.page_size_tokens = 16;
  c.runtime.max_total_tokens = 3 * 16;
  c.batches = {1, 2};
  c.context_tokens = 20;
  c.warmup_steps = 1;
  c.decode_steps = 2;
  c.profile_steps = 1;
  return c;
}

const tools::SkippedRow* find_skip(const tools::ModelBenchReport& r, const std::string& kind, int batch) {
  for (const tools::SkippedRow& s : r.skipped)
    if (s.kind == kind && s.batch == batch) return &s;
  return nullptr;
}

TEST(BenchModelPool, RowsThatDoNotFitThePoolAreSkippedAndTheRestRun) {
  tools::ModelBenchConfig c = small_pool_bench();
  c.draft_tokens = {1};
  c.prefill_tokens = 64;  // 4 pages
  auto r = tools::run_model_bench(c);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();

  // Batch 1 decodes and verifies (2 pages); batch 2 (4 pages) and the prefill (4) do not fit.
  ASSERT_EQ(r->decode.size(), 1u);
  EXPECT_EQ(r->decode[0].batch, 1);
  EXPECT_GT(r->decode[0].tok_s, 0.0);
  ASSERT_EQ(r->verify.size(), 1u);
  EXPECT_EQ(r->verify[0].batch, 1);
  EXPECT_EQ(r->verify[0].draft_tokens, 1);
  EXPECT_EQ(r->prefill_tokens, 0);
  ASSERT_EQ(r->skipped.size(), 3u);

  const tools::SkippedRow* d = find_skip(*r, "decode", 2);
  ASSERT_NE(d, nullptr);
  EXPECT_EQ(d->pages_needed, 4);
  EXPECT_EQ(d->pages_held, 3);
  EXPECT_EQ(d->tokens_each, 25);
  EXPECT_NE(d->message.find("decode batch 2 x context 20: skipped: 2 sequences x 2 KV pages (25 tokens each"),
            std::string::npos)
      << d->message;
  EXPECT_NE(d->message.find("= 4 pages; the pool holds 3 pages"), std::string::npos) << d->message;
  EXPECT_NE(d->message.find("sized from --max-total-tokens"), std::string::npos) << d->message;
  EXPECT_NE(d->message.find("lower --batch or --context"), std::string::npos) << d->message;

  const tools::SkippedRow* v = find_skip(*r, "verify", 2);
  ASSERT_NE(v, nullptr);
  EXPECT_EQ(v->draft_tokens, 1);
  EXPECT_EQ(v->tokens_each, 26);
  EXPECT_NE(v->message.find("verify k 1, batch 2 x context 20: skipped:"), std::string::npos) << v->message;

  const tools::SkippedRow* p = find_skip(*r, "prefill", 1);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(p->pages_needed, 4);
  EXPECT_NE(p->message.find("prefill of 64 tokens: skipped: 4 KV pages (16 tokens a page); the pool holds 3 pages"),
            std::string::npos)
      << p->message;
  EXPECT_NE(p->message.find("lower --prefill"), std::string::npos) << p->message;

  // The table shows the skipped rows where they would have been; the JSON lists them.
  const std::string table = tools::format_model_bench(*r);
  EXPECT_NE(table.find("| 2 | " + d->message + " |"), std::string::npos) << table;
  EXPECT_NE(table.find("| 1 | 2 | " + v->message + " |"), std::string::npos) << table;
  EXPECT_NE(table.find(p->message), std::string::npos) << table;
  const nlohmann::json j = tools::model_bench_to_json(*r);
  ASSERT_EQ(j["skipped"].size(), 3u);
  EXPECT_EQ(j["skipped"][0]["pages_needed"], 4);
}

TEST(BenchModelPool, NoRowThatFitsIsAnError) {
  tools::ModelBenchConfig c = small_pool_bench();
  c.batches = {2, 4};
  auto r = tools::run_model_bench(c);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(r.status().message().find("no row fits the cache pools"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("decode batch 4 x context 20: skipped: 4 sequences x 2 KV pages"),
            std::string::npos)
      << r.status().message();
}

}  // namespace
}  // namespace moonrun
