// The K3 forward (model/kimi_k3.cpp) on the CPU backend, on the demo model: the cached
// decode path (recurrent KDA, absorbed MLA, one token per forward) must reproduce the
// one-shot prefill path (chunked KDA with a partial last chunk, plain MLA) row for row;
// sequences in one flat batch must not mix; a broken checkpoint names the tensor.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>
#include <unistd.h>
#include <vector>

#include <gtest/gtest.h>

#include "backend/cpu/cpu_ops.h"
#include "model/checkpoint.h"
#include "model/demo_model.h"
#include "model/kimi_k3.h"
#include "model/model.h"

namespace moonrun {
namespace {

const std::string& demo_dir() {
  static const std::string dir = [] {
    std::string d = (std::filesystem::temp_directory_path() / ("moonrun_k3_test_" + std::to_string(getpid()))).string();
    Status st = write_demo_model(d, 1024);
    MR_CHECK(st.is_ok()) << st.to_string();
    return d;
  }();
  return dir;
}

// The model on a CPU backend with its own pools: `slots` state slots, `pages` KV pages.
struct Harness {
  cpu::CpuOps ops;
  std::unique_ptr<Model> model;
  CachePools pools;
  Harness(int slots, int pages, int page_size = 64) {
    auto ckpt = Checkpoint::open(demo_dir());
    MR_CHECK(ckpt.is_ok()) << ckpt.status().to_string();
    auto m = load_model(ops, **ckpt);
    MR_CHECK(m.is_ok()) << m.status().to_string();
    model = std::move(m).value();
    const CacheSpec spec = model->cache_spec();
    pools.state = ops.alloc(slots, spec.state_floats_per_slot, DType::F32, "state");
    pools.kv = ops.alloc(static_cast<int64_t>(spec.kv_layers) * pages * page_size, spec.kv_row_width, DType::F32, "kv");
    pools.num_slots = slots;
    pools.num_pages = pages;
    pools.page_size_tokens = page_size;
  }
  int vocab() const { return model->config().vocab_size; }
  std::vector<float> forward(const ForwardBatch& batch) {
    ops.reset_scratch();
    const BatchView view = ops.upload_batch(batch);
    Tensor logits = ops.scratch(view.n_logit_rows(), vocab(), DType::F32);
    model->forward(ops, view, pools, logits);
    std::vector<float> out(static_cast<size_t>(logits.numel()));
    ops.download(logits, out.data());
    return out;
  }
};

std::vector<int32_t> prompt_ids(int n) {
  std::vector<int32_t> ids;
  for (int i = 0; i < n; ++i) ids.push_back((i * 37 + 11) % 1024);
  return ids;
}

float max_abs_diff(const float* a, const float* b, size_t n) {
  float m = 0;
  for (size_t i = 0; i < n; ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

TEST(KimiK3Cpu, DecodeThroughCachesMatchesPrefill) {
  const int T = 70, n_prefill = 5;  // 70 > 64: a full and a partial chunk
  const auto ids = prompt_ids(T);
  const int32_t pages[] = {0, 1};

  // One forward over all T tokens, logits for every position.
  Harness a(1, 2);
  const int V = a.vocab();
  ForwardBatch all;
  all.add_seq(ids.data(), T, 0, 0, pages, 2, /*all_logits=*/true);
  const std::vector<float> logits_all = a.forward(all);
  ASSERT_EQ(logits_all.size(), static_cast<size_t>(T) * V);

  // A short prefill, then one token per forward through the caches.
  Harness b(1, 2);
  ForwardBatch step;
  step.add_seq(ids.data(), n_prefill, 0, 0, pages, 2);
  std::vector<float> row = b.forward(step);
  float worst = max_abs_diff(row.data(), &logits_all[static_cast<size_t>(n_prefill - 1) * V], V);
  for (int t = n_prefill; t < T; ++t) {
    ForwardBatch one;
    one.add_seq(&ids[t], 1, t, 0, pages, 2);
    row = b.forward(one);
    worst = std::max(worst, max_abs_diff(row.data(), &logits_all[static_cast<size_t>(t) * V], V));
  }
  // Two correct fp32 evaluation orders of the same math: ~1e-5 apart at this scale.
  EXPECT_LT(worst, 1e-3f);
  std::printf("max |prefill - decode| logit difference: %g\n", worst);
  float scale = 0;
  for (float v : logits_all) scale = std::max(scale, std::fabs(v));
  EXPECT_GT(scale, 0.1f);  // the logits are not trivially zero
}

TEST(KimiK3Cpu, BatchedSequencesMatchSeparateRuns) {
  const auto a = prompt_ids(9), b = prompt_ids(20);
  auto run_alone = [&](const std::vector<int32_t>& ids) {
    Harness h(1, 1);
    ForwardBatch fb;
    const int32_t page = 0;
    fb.add_seq(ids.data(), static_cast<int>(ids.size()), 0, 0, &page, 1);
    return h.forward(fb);
  };
  Harness h(3, 4);
  const int V = h.vocab();
  ForwardBatch fb;
  const int32_t pages_a[] = {3}, pages_b[] = {1};
  fb.add_seq(a.data(), 9, 0, 2, pages_a, 1);
  fb.add_seq(b.data(), 20, 0, 0, pages_b, 1, /*all_logits=*/true);
  ASSERT_EQ(fb.logit_rows.size(), 1u + 20u);
  const std::vector<float> out = h.forward(fb);
  const auto ra = run_alone(a), rb = run_alone(b);
  // The CPU backend computes each row alone: batching changes nothing, bit for bit.
  EXPECT_EQ(max_abs_diff(out.data(), ra.data(), V), 0.0f);
  EXPECT_EQ(max_abs_diff(&out[static_cast<size_t>(20) * V], rb.data(), V), 0.0f);
}

TEST(KimiK3Cpu, MissingAndMisshapenTensorsNameTheTensor) {
  namespace fs = std::filesystem;
  const std::string dir = demo_dir() + "_broken";
  fs::create_directories(dir);
  fs::copy_file(demo_dir() + "/config.json", dir + "/config.json", fs::copy_options::overwrite_existing);
  auto load = [&]() -> Status {
    auto ckpt = Checkpoint::open(dir);
    if (!ckpt.is_ok()) return ckpt.status();
    cpu::CpuOps ops;
    return load_model(ops, **ckpt).status();
  };
  // One shard holding a single tensor of the wrong shape; everything else missing.
  std::vector<TensorToWrite> t = {{"language_model.model.embed_tokens.weight", DType::BF16, {4, 4},
                                   std::vector<uint8_t>(32, 0)}};
  ASSERT_TRUE(write_safetensors(dir + "/model.safetensors", t).is_ok());
  Status st = load();
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("embed_tokens.weight"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("[4, 4]"), std::string::npos) << st.message();
  t[0].shape = {1280, 128};
  t[0].bytes.assign(1280 * 128 * 2, 0);
  ASSERT_TRUE(write_safetensors(dir + "/model.safetensors", t).is_ok());
  st = load();
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("layers.0.input_layernorm.weight"), std::string::npos) << st.message();
  fs::remove_all(dir);
}

// The spec the loader follows is the one verify and plan read: every listed tensor exists
// in the demo checkpoint with that dtype and shape, and nothing else is stored.
TEST(WeightSpec, ListsExactlyTheCheckpointsTensors) {
  auto ckpt = Checkpoint::open(demo_dir());
  ASSERT_TRUE(ckpt.is_ok());
  auto cfg = parse_model_config((*ckpt)->config(), "config.json");
  ASSERT_TRUE(cfg.is_ok());
  const auto spec = weight_spec(*cfg);
  EXPECT_EQ(spec.size(), (*ckpt)->tensor_names().size());
  for (const TensorSpec& t : spec) {
    const TensorInfo* info = (*ckpt)->find(t.name);
    ASSERT_NE(info, nullptr) << t.name;
    EXPECT_EQ(info->dtype, t.dtype) << t.name;
    EXPECT_EQ(info->shape, t.shape) << t.name;
  }
}

}  // namespace
}  // namespace moonrun
