// The per-op profile of `moonrun bench-model` (backend/op_profile.h) on a real fixture:
// profiling must not change what the model computes, must see every op the forward issues,
// and the bytes it counts from the ops' own tensors must agree with the floor the benchmark
// computes from the config (tools/bench_model.h) - two independent ways to count a step.
#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "../support/fixture_files.h"
#include "../support/runtimes.h"
#include "backend/op_profile.h"
#include "tools/bench_model.h"

namespace moonrun {
namespace {

std::string fixture(const char* name) { return fixtures::fixtures_dir() + "/" + name; }

StepInput prompt_step(const std::vector<int32_t>& ids, const std::vector<int32_t>& pages, int slot) {
  StepInput in;
  in.before.push_back({-1, slot});
  StepSeq s;
  s.new_token_ids = ids;
  s.state_slot = slot;
  s.pages = pages;
  s.sample = true;
  s.all_logits = true;
  in.seqs.push_back(s);
  in.return_logits = true;
  SamplingRow row;
  row.temperature = 0;
  in.sampling.rows.push_back(row);
  return in;
}

TEST(OpProfile, AProfiledStepComputesExactlyWhatAPlainStepDoes) {
  Runtime rt = testing::make_runtime(fixture("k3-tiny-a"), testing::test_runtime_options("cpu", 64, 2));
  ASSERT_TRUE(rt.runner);
  const std::vector<int32_t> ids = {5, 17, 200, 3, 99, 41, 7, 300};
  StepOutput plain, profiled;
  ASSERT_TRUE(rt.runner->step(prompt_step(ids, {0}, 0), plain).is_ok());
  OpProfile profile;
  ASSERT_TRUE(rt.runner->set_op_profile(&profile));
  ASSERT_TRUE(rt.runner->step(prompt_step(ids, {1}, 1), profiled).is_ok());
  rt.runner->set_op_profile(nullptr);
  ASSERT_EQ(plain.logits.size(), profiled.logits.size());
  for (size_t i = 0; i < plain.logits.size(); ++i) ASSERT_EQ(plain.logits[i], profiled.logits[i]) << i;
  EXPECT_EQ(plain.samples[0].token, profiled.samples[0].token);
  // Every kind of op the K3 forward runs was seen.
  std::vector<std::string> names;
  for (const OpStat& s : profile.sorted()) names.push_back(s.op);
  for (const char* want : {"embedding", "kda_recurrence (prefill)", "mla_attention (prefill)", "short_conv (prefill)",
                           "router_topk", "attn_res_mix", "sample"}) {
    bool found = false;
    for (const std::string& n : names) found = found || n == want;
    EXPECT_TRUE(found) << want;
  }
}

TEST(OpProfile, BytesCountedFromTheOpsMatchTheFloorCountedFromTheConfig) {
  tools::ModelBenchConfig c;
  c.model = fixture("k3-tiny-a");
  c.runtime.device = "cpu";
  c.runtime.log = false;
  c.batches = {1};
  c.context_tokens = 8;
  c.warmup_steps = 1;
  c.decode_steps = 2;
  c.profile_steps = 2;
  auto r = tools::run_model_bench(c);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  ASSERT_EQ(r->decode.size(), 1u);
  const tools::DecodeFigure& f = r->decode[0];
  ASSERT_FALSE(f.ops.empty());
  const nlohmann::json cfg = nlohmann::json::parse(std::ifstream(c.model + "/config.json"));
  const nlohmann::json& text = cfg.contains("text_config") ? cfg["text_config"] : cfg;
  const double io = text.value("routed_expert_hidden_size", 0) > 0 ? text["routed_expert_hidden_size"].get<double>()
                                                                    : text["hidden_size"].get<double>();
  // At batch 1 the expected distinct experts is exactly top-k, so the experts' bytes the
  // moe op counted from its stacked tensors equal the config's MXFP4 arithmetic.
  double moe_weights = 0, linear_bytes = 0;
  for (const tools::OpFigure& o : f.ops) {
    if (o.op.rfind("moe_experts", 0) == 0) {
      // Subtract the activations: x and y [1, io] F32 on the CPU, io the experts' (latent) width.
      moe_weights += o.bytes - o.calls * 4.0 * (2 * io);
    }
    if (o.op.rfind("linear", 0) == 0) linear_bytes += o.bytes;
  }
  EXPECT_NEAR(moe_weights, f.bytes.experts, 1e-6 * f.bytes.experts);
  // The dense weights are what the linear ops read (plus norms and the AttnRes vectors,
  // and the activations, a few percent at this width).
  EXPECT_NEAR(linear_bytes, f.bytes.dense, 0.1 * f.bytes.dense);
  // The JSON carries the fields the results files are read by.
  const nlohmann::json j = tools::model_bench_to_json(*r);
  for (const char* key : {"gpu", "date", "commit", "copy_tb_s", "decode"}) EXPECT_TRUE(j.contains(key)) << key;
  for (const char* key : {"batch", "step_ms", "tok_s", "bytes", "floor_ratio", "ops"})
    EXPECT_TRUE(j["decode"][0].contains(key)) << key;
}

}  // namespace
}  // namespace moonrun
