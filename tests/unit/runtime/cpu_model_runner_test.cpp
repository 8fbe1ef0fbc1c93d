// The engine on the real CPU forward: concurrent greedy requests through the scheduler,
// the paged MLA pool and the KDA slots give exactly what single-sequence generation
// (`moonrun generate`, model/generate.h) gives for each prompt alone.
#include "runtime/cpu_model_runner.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <thread>
#include <unistd.h>

#include "model/demo_model.h"
#include "model/generate.h"

namespace moonrun {
namespace {

using namespace std::chrono_literals;

std::shared_ptr<const KimiK3Model> demo_model() {
  static std::shared_ptr<const KimiK3Model> model = [] {
    const std::string dir =
        (std::filesystem::temp_directory_path() / ("moonrun_runner_test_" + std::to_string(getpid()))).string();
    const Status st = write_demo_model(dir, 1024);
    MR_CHECK(st.is_ok()) << st.to_string();
    auto m = KimiK3Model::load(dir);
    MR_CHECK(m.is_ok()) << m.status().to_string();
    std::filesystem::remove_all(dir);
    return std::shared_ptr<const KimiK3Model>(std::move(m).value());
  }();
  return model;
}

std::vector<int32_t> prompt(int i) {
  std::vector<int32_t> ids;
  const int n = 3 + 11 * i;  // 3 .. 47 tokens
  for (int t = 0; t < n; ++t) ids.push_back((i * 97 + t * 37 + 11) % 1024);
  return ids;
}

TEST(CpuModelRunner, CacheLayoutCountsRowsAndStates) {
  const ModelConfig& cfg = demo_model()->config();
  const CacheLayout layout = cpu_cache_layout(cfg);
  EXPECT_EQ(layout.bytes_per_token(), int64_t{cfg.num_mla_layers} * (cfg.kv_lora_rank + cfg.qk_rope_head_dim) * 4);
  const int64_t hd = int64_t{cfg.kda_num_heads} * cfg.kda_head_dim;
  EXPECT_EQ(layout.kda_slot_bytes, cfg.num_kda_layers * (3 * (cfg.kda_conv_kernel - 1) * hd + hd * cfg.kda_head_dim) * 4);
}

// The greedy tokens of prompt(0..n_prompts) each run alone through generate(): the reference
// the batched engine must reproduce. Shorter than n_prompts when a run failed.
std::vector<std::vector<int32_t>> generate_alone(const KimiK3Model& model, int n_prompts, int max_tokens) {
  std::vector<std::vector<int32_t>> want;
  for (int i = 0; i < n_prompts; ++i) {
    GenerateOptions opt;
    opt.max_tokens = max_tokens;
    auto r = generate(model, prompt(i), opt);
    EXPECT_TRUE(r.is_ok()) << r.status().to_string();
    if (!r.is_ok()) break;
    want.push_back(r->token_ids);
  }
  return want;
}

TEST(CpuModelRunner, ConcurrentGreedyEqualsGenerateAlone) {
  auto model = demo_model();
  const int n_prompts = 5, max_tokens = 8;
  const std::vector<std::vector<int32_t>> want = generate_alone(*model, n_prompts, max_tokens);
  ASSERT_EQ(want.size(), static_cast<size_t>(n_prompts));
  EngineOptions options;
  options.max_running_requests = 4;  // 5 clients: one waits and joins running decodes
  options.chunked_prefill_size = 64; // >= every prompt: prefills as generate() does them
  options.max_total_tokens = 1024;
  options.eos_token_ids = {-1};      // generate() does not stop at eos
  auto loop = make_cpu_engine(model, options, nullptr);
  ASSERT_TRUE(loop.is_ok()) << loop.status().to_string();
  ASSERT_TRUE((*loop)->start().is_ok());
  std::vector<std::vector<int32_t>> got(n_prompts);
  std::vector<std::thread> clients;
  for (int i = 0; i < n_prompts; ++i) {
    clients.emplace_back([&, i] {
      SamplingParams p;
      p.temperature = 0;
      p.max_tokens = max_tokens;
      auto s = (*loop)->submit(prompt(i), p);
      ASSERT_TRUE(s.is_ok()) << s.status().to_string();
      RequestOutput out;
      const auto deadline = std::chrono::steady_clock::now() + 120s;
      while (!(*s)->done() && std::chrono::steady_clock::now() < deadline) {
        if (!(*s)->next(out, 50ms)) continue;
        EXPECT_TRUE(out.error.is_ok()) << out.error.to_string();
        got[i].insert(got[i].end(), out.new_token_ids.begin(), out.new_token_ids.end());
      }
    });
  }
  for (auto& t : clients) t.join();
  for (int i = 0; i < n_prompts; ++i) EXPECT_EQ(got[i], want[i]) << "prompt " << i;
  EXPECT_TRUE((*loop)->alive());
  EXPECT_EQ((*loop)->stats().cache.free_slots, 4);
}

}  // namespace
}  // namespace moonrun

namespace moonrun {
namespace {

// Chunked prefill (16-token steps) and preemption (a pool of 96 tokens for 5 requests of up
// to 55) change the order of float operations (prefill chunks split differently, preempted
// requests recompute their generated tokens as a prefill), not the math: on the demo model
// the greedy tokens stay those of generate().
TEST(CpuModelRunner, ChunkingAndPreemptionKeepGreedyOutputs) {
  auto model = demo_model();
  const int n_prompts = 5, max_tokens = 8;
  const std::vector<std::vector<int32_t>> want = generate_alone(*model, n_prompts, max_tokens);
  ASSERT_EQ(want.size(), static_cast<size_t>(n_prompts));
  // The single-threaded Engine, every request queued before the first step: the schedule
  // (and so the preemptions) does not depend on thread timing.
  const ModelConfig& cfg = model->config();
  CacheConfig cache_config;
  cache_config.layout = cpu_cache_layout(cfg);
  cache_config.page_size_tokens = 8;
  cache_config.num_pages = 12;  // 96 tokens
  cache_config.num_kda_slots = 5;
  CacheManager cache(cache_config);
  CpuModelRunner runner(model, cache.mla_view(), cache_config.num_kda_slots);
  EngineConfig config;
  config.scheduler = {.max_running_requests = 5, .max_tokens_per_step = 16};
  config.max_model_len = 96;
  Engine engine(config, cache, runner, nullptr);
  for (int i = 0; i < n_prompts; ++i) {
    SamplingParams p;
    p.temperature = 0;
    p.max_tokens = max_tokens;
    ASSERT_TRUE(engine.add_request(i, prompt(i), p).is_ok());
  }
  std::vector<std::vector<int32_t>> got(n_prompts);
  std::vector<RequestOutput> outs;
  while (engine.has_work()) {
    const Status st = engine.step(outs);
    ASSERT_TRUE(st.is_ok()) << st.to_string();
  }
  for (const RequestOutput& o : outs) got[o.request_id].insert(got[o.request_id].end(), o.new_token_ids.begin(), o.new_token_ids.end());
  for (int i = 0; i < n_prompts; ++i) EXPECT_EQ(got[i], want[i]) << "prompt " << i;
  EXPECT_GT(engine.stats().preemptions_total, 0);
  EXPECT_EQ(engine.stats().cache.free_pages, 12);
}

}  // namespace
}  // namespace moonrun
