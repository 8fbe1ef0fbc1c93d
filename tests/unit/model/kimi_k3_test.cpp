// The CPU forward on the demo model: the cached decode path (recurrent KDA, absorbed MLA,
// one token per forward) must reproduce the one-shot prefill path (chunked KDA with a
// partial last chunk, plain MLA) row for row; batching must not mix sequences; bad input
// comes back as one-line errors.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <unistd.h>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "model/checkpoint.h"
#include "model/demo_model.h"
#include "model/generate.h"
#include "model/kimi_k3.h"

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

const KimiK3Model& demo_model() {
  static std::unique_ptr<KimiK3Model> m = [] {
    auto r = KimiK3Model::load(demo_dir());
    MR_CHECK(r.is_ok()) << r.status().to_string();
    return std::move(r).value();
  }();
  return *m;
}

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
  const KimiK3Model& model = demo_model();
  const ModelConfig& cfg = model.config();
  const int V = cfg.vocab_size, T = 70, n_prefill = 5;  // 70 > 64: a full and a partial chunk
  const auto ids = prompt_ids(T);

  // One forward over all T tokens, logits for every position.
  KdaSlotPool kda_a(cfg, 1);
  MlaPool mla_a(cfg, 2, 64);
  ForwardBatch all;
  all.seqs.push_back(ForwardSeq{0, 0, ids, {0, 1}, true});
  std::vector<float> logits_all(static_cast<size_t>(T) * V);
  ASSERT_TRUE(model.forward(all, kda_a, mla_a.view(), logits_all.data()).is_ok());

  // A short prefill, then one token per forward through the caches.
  KdaSlotPool kda_b(cfg, 1);
  MlaPool mla_b(cfg, 2, 64);
  ForwardBatch step;
  step.seqs.push_back(ForwardSeq{0, 0, std::vector<int32_t>(ids.begin(), ids.begin() + n_prefill), {0, 1}, false});
  std::vector<float> row(V);
  ASSERT_TRUE(model.forward(step, kda_b, mla_b.view(), row.data()).is_ok());
  float worst = max_abs_diff(row.data(), &logits_all[static_cast<size_t>(n_prefill - 1) * V], V);
  for (int t = n_prefill; t < T; ++t) {
    step.seqs[0].n_past_tokens = t;
    step.seqs[0].new_token_ids = {ids[t]};
    ASSERT_TRUE(model.forward(step, kda_b, mla_b.view(), row.data()).is_ok());
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
  const KimiK3Model& model = demo_model();
  const ModelConfig& cfg = model.config();
  const int V = cfg.vocab_size;
  const auto a = prompt_ids(9), b = prompt_ids(20);
  auto run_alone = [&](const std::vector<int32_t>& ids) {
    KdaSlotPool kda(cfg, 1);
    MlaPool mla(cfg, 1, 64);
    ForwardBatch fb;
    fb.seqs.push_back(ForwardSeq{0, 0, ids, {0}, false});
    std::vector<float> out(V);
    EXPECT_TRUE(model.forward(fb, kda, mla.view(), out.data()).is_ok());
    return out;
  };
  KdaSlotPool kda(cfg, 3);
  MlaPool mla(cfg, 4, 64);
  ForwardBatch fb;
  fb.seqs.push_back(ForwardSeq{2, 0, a, {3}, false});
  fb.seqs.push_back(ForwardSeq{0, 0, b, {1}, true});
  ASSERT_EQ(fb.n_logit_rows(), 1 + 20);
  std::vector<float> out(static_cast<size_t>(fb.n_logit_rows()) * V);
  ASSERT_TRUE(model.forward(fb, kda, mla.view(), out.data()).is_ok());
  auto ra = run_alone(a), rb = run_alone(b);
  EXPECT_LT(max_abs_diff(out.data(), ra.data(), V), 1e-5f);
  EXPECT_LT(max_abs_diff(&out[static_cast<size_t>(20) * V], rb.data(), V), 1e-5f);
}

TEST(KimiK3Cpu, GenerateIsGreedyOverItsOwnLogits) {
  GenerateOptions opt;
  opt.max_tokens = 6;
  opt.keep_logits = true;
  auto r = generate(demo_model(), prompt_ids(7), opt);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  const int V = demo_model().config().vocab_size;
  ASSERT_EQ(r->token_ids.size(), 6u);
  ASSERT_EQ(r->logits.size(), 6u * V);
  for (int k = 0; k < 6; ++k) {
    const float* row = &r->logits[static_cast<size_t>(k) * V];
    EXPECT_EQ(r->token_ids[k], std::max_element(row, row + V) - row);
  }
  // Sampling is reproducible from the seed.
  opt.temperature = 1.0f;
  opt.seed = 42;
  auto s1 = generate(demo_model(), prompt_ids(7), opt), s2 = generate(demo_model(), prompt_ids(7), opt);
  ASSERT_TRUE(s1.is_ok() && s2.is_ok());
  EXPECT_EQ(s1->token_ids, s2->token_ids);
}

TEST(KimiK3Cpu, BadInputIsAnErrorNotACrash) {
  const KimiK3Model& model = demo_model();
  const ModelConfig& cfg = model.config();
  KdaSlotPool kda(cfg, 1);
  MlaPool mla(cfg, 1, 64);
  std::vector<float> out(cfg.vocab_size);
  ForwardBatch fb;
  fb.seqs.push_back(ForwardSeq{0, 0, {1, cfg.vocab_size}, {0}, false});
  Status st = model.forward(fb, kda, mla.view(), out.data());
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("outside the vocabulary"), std::string::npos) << st.message();
  fb.seqs[0] = ForwardSeq{5, 0, {1}, {0}, false};
  EXPECT_FALSE(model.forward(fb, kda, mla.view(), out.data()).is_ok());
  fb.seqs[0] = ForwardSeq{0, 100, {1}, {0}, false};  // 101 tokens do not fit one 64-token page
  EXPECT_FALSE(model.forward(fb, kda, mla.view(), out.data()).is_ok());
}

TEST(KimiK3Cpu, MissingAndMisshapenTensorsNameTheTensor) {
  namespace fs = std::filesystem;
  const std::string dir = demo_dir() + "_broken";
  fs::create_directories(dir);
  fs::copy_file(demo_dir() + "/config.json", dir + "/config.json", fs::copy_options::overwrite_existing);
  // One shard holding a single tensor of the wrong shape; everything else missing.
  std::vector<TensorToWrite> t = {{"language_model.model.embed_tokens.weight", DType::BF16, {4, 4},
                                   std::vector<uint8_t>(32, 0)}};
  ASSERT_TRUE(write_safetensors(dir + "/model.safetensors", t).is_ok());
  auto r = KimiK3Model::load(dir);
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("embed_tokens.weight"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("[4, 4]"), std::string::npos) << r.status().message();
  t[0].shape = {1280, 128};
  t[0].bytes.assign(1280 * 128 * 2, 0);
  ASSERT_TRUE(write_safetensors(dir + "/model.safetensors", t).is_ok());
  r = KimiK3Model::load(dir);
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("layers.0.input_layernorm.weight"), std::string::npos) << r.status().message();
  fs::remove_all(dir);
}

}  // namespace
}  // namespace moonrun
