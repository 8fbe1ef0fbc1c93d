// The prefill lane on the CUDA backend (runtime/prefill_lane.h, Ops::make_lane): a long
// prompt's chunks on the lane's stream while decode steps (captured graphs) run on the main
// one give, bit for bit, what the same steps give one after another on one stream. The lane
// has its own scratch, staging and cuBLAS handle and writes only its sequence's pages and
// state slot; a race on anything shared would show as other bits. In fp32 and bf16, on a
// KDA + MLA fixture and on K3.1's (its indexer-key pages beside the latent ones). Then the
// engine with the lane on gives the tokens of the engine without it (fp32, as
// speculative_cuda_test.cpp compares its runs), on one GPU and in a TP 2 group (two GPUs).
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "../support/fixture_files.h"
#include "op_test_util.h"
#include "../support/runtimes.h"
#include "engine/engine.h"
#include "runtime/model_runner.h"

namespace moonrun {
namespace {

std::vector<int32_t> pattern_tokens(int n, int vocab, int salt) {
  std::vector<int32_t> t;
  for (int i = 0; i < n; ++i) t.push_back((i * 131 + salt * 17 + (i * i) % 7) % vocab);
  return t;
}

std::vector<int32_t> page_range(int first, int n) {
  std::vector<int32_t> p;
  for (int i = 0; i < n; ++i) p.push_back(first + i);
  return p;
}

// Everything the steps returned (logits rows, then tokens), in step order.
std::vector<float> run_steps(const std::string& dir, const std::string& dtype, bool concurrent) {
  std::vector<float> record;
  RuntimeOptions ro = testing::test_runtime_options("cuda", 4096, 4);
  ro.mem_fraction_static = 0.2;
  ro.dtype = dtype;
  ro.max_tokens_per_step = 256;
  ro.prefill_lane_tokens = 256;
  Runtime rt = testing::make_runtime(dir, ro);
  if (!rt.runner) return record;
  StepRunner& main = *rt.runner;
  PrefillLane* lane = main.prefill_lane();
  EXPECT_NE(lane, nullptr);
  if (!lane) return record;
  const int vocab = rt.config.vocab_size;
  const std::vector<int32_t> a = pattern_tokens(1024, vocab, 1), pages_a = page_range(0, 64);
  const std::vector<int32_t> pages_b = page_range(64, 8), pages_c = page_range(72, 8);
  std::vector<int32_t> b = pattern_tokens(40, vocab, 2), c = pattern_tokens(25, vocab, 3);
  auto seq = [](std::span<const int32_t> ids, int n_past, int slot, const std::vector<int32_t>& pages, bool sample) {
    StepSeq s;
    s.new_token_ids = ids;
    s.n_past = n_past;
    s.state_slot = slot;
    s.pages = pages;
    s.sample = sample;
    return s;
  };
  auto keep = [&](const StepOutput& out) {
    record.insert(record.end(), out.logits.begin(), out.logits.end());
    for (const SampleResult& r : out.samples) record.push_back(static_cast<float>(r.token));
  };
  // B and C prefilled together, on the main lane.
  {
    StepInput in;
    in.seqs = {seq(b, 0, 1, pages_b, true), seq(c, 0, 2, pages_c, true)};
    in.sampling.rows.resize(2);
    in.return_logits = true;
    StepOutput out;
    EXPECT_TRUE(main.step(in, out).is_ok());
    keep(out);
    b.push_back(out.samples.at(0).token);
    c.push_back(out.samples.at(1).token);
  }
  for (int chunk = 0; chunk < 4; ++chunk) {
    StepInput ain;
    ain.seqs = {seq(std::span<const int32_t>(a).subspan(chunk * 256, 256), chunk * 256, 0, pages_a, chunk == 3)};
    ain.sampling.rows.resize(chunk == 3 ? 1 : 0);
    ain.return_logits = true;
    StepOutput aout;
    if (concurrent) lane->submit(&ain, &aout);
    else EXPECT_TRUE(main.step(ain, aout).is_ok());
    // Three decode steps of B and C (a captured graph) while the chunk runs on the lane.
    for (int d = 0; d < 3; ++d) {
      const std::vector<int32_t> tb = {b.back()}, tc = {c.back()};
      StepInput in;
      in.seqs = {seq(tb, static_cast<int>(b.size()) - 1, 1, pages_b, true),
                 seq(tc, static_cast<int>(c.size()) - 1, 2, pages_c, true)};
      in.sampling.rows.resize(2);
      in.return_logits = true;
      StepOutput out;
      EXPECT_TRUE(main.step(in, out).is_ok());
      keep(out);
      b.push_back(out.samples.at(0).token);
      c.push_back(out.samples.at(1).token);
    }
    if (concurrent) EXPECT_TRUE(lane->take().is_ok());
    keep(aout);
  }
  if (concurrent) EXPECT_EQ(lane->runner().stats().steps, 4);
  return record;
}

TEST(CudaPrefillLane, ChunksBesideDecodeGraphsGiveTheBitsOfOneStream) {
  REQUIRE_GPU();
  for (const char* name : {"k3-tiny-a", "k31-tiny-a"})
    for (const char* dtype : {"float32", "bfloat16"}) {
      const std::string dir = fixtures::fixtures_dir() + "/" + name;
      const std::vector<float> one = run_steps(dir, dtype, false);
      const std::vector<float> two = run_steps(dir, dtype, true);
      ASSERT_FALSE(one.empty()) << name << " " << dtype;
      ASSERT_EQ(one.size(), two.size()) << name << " " << dtype;
      size_t differ = 0;
      for (size_t i = 0; i < one.size(); ++i) differ += std::memcmp(&one[i], &two[i], sizeof(float)) != 0;
      EXPECT_EQ(differ, 0u) << name << " " << dtype << ": " << differ << " of " << one.size() << " values differ";
    }
}

// The engine: two long prompts beside short ones, greedy, fp32; tokens as without the lane.
// tp > 1: a tensor-parallel group's lane (its own NCCL communicator), on that many GPUs.
void engine_with_and_without_the_lane(int tp) {
  const std::string dir = fixtures::fixtures_dir() + "/k3-tiny-a";
  std::vector<std::vector<int32_t>> prompts = {pattern_tokens(900, 512, 4), pattern_tokens(12, 512, 5),
                                               pattern_tokens(600, 512, 6), pattern_tokens(30, 512, 7)};
  auto run = [&](int lane_min_tokens, int64_t* lane_steps) {
    std::vector<std::vector<int32_t>> tokens(prompts.size());
    RuntimeOptions ro = testing::test_runtime_options("cuda", 4096, 4);
    ro.mem_fraction_static = 0.2;
    ro.dtype = "float32";
    ro.tp_size = ro.ep_size = tp;
    ro.max_tokens_per_step = 128;
    ro.prefill_lane_tokens = lane_min_tokens > 0 ? 128 : 0;
    Runtime rt = testing::make_runtime(dir, ro);
    if (!rt.runner) return tokens;
    CacheManager cache(rt.cache);
    EngineConfig ec;
    ec.scheduler = {.max_running_requests = 4, .max_tokens_per_step = 128};
    ec.max_model_len = 1024;
    ec.prefill_lane_min_tokens = lane_min_tokens;
    ec.prefill_lane_chunk_tokens = 128;
    {
      Engine engine(ec, cache, *rt.runner, nullptr);
      for (size_t i = 0; i < prompts.size(); ++i) {
        SamplingParams p;
        p.temperature = 0;
        p.max_tokens = 20;
        EXPECT_TRUE(engine.add_request(i, prompts[i], p).is_ok());
      }
      std::vector<RequestOutput> outs;
      while (engine.has_work()) {
        const Status st = engine.step(outs);
        EXPECT_TRUE(st.is_ok()) << st.to_string();
        if (!st.is_ok()) break;
      }
      for (const RequestOutput& o : outs)
        tokens[o.request_id].insert(tokens[o.request_id].end(), o.new_token_ids.begin(), o.new_token_ids.end());
    }
    if (lane_steps && rt.runner->prefill_lane()) *lane_steps = rt.runner->prefill_lane()->runner().stats().steps;
    return tokens;
  };
  int64_t lane_steps = 0;
  const auto plain = run(0, nullptr);
  const auto lane = run(200, &lane_steps);
  for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(lane[i], plain[i]) << "request " << i;
  EXPECT_GT(lane_steps, 4);
  std::printf("tp %d: %lld chunks on the lane\n", tp, static_cast<long long>(lane_steps));
}

TEST(CudaPrefillLane, TheEngineWithTheLaneGivesTheTokensWithoutIt) {
  REQUIRE_GPU();
  engine_with_and_without_the_lane(1);
}

TEST(CudaPrefillLane, AGroupsLaneGivesTheTokensWithoutIt) {
  if (cuda::device_count() < 2) GTEST_SKIP() << "2 GPUs needed, " << cuda::device_count() << " visible";
  engine_with_and_without_the_lane(2);
}

}  // namespace
}  // namespace moonrun
