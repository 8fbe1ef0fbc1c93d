#pragma once
// The reference fixtures' contracts (tests/fixtures/README.md) for a runner on the GPU, for
// model_cuda_test.cpp (one GPU) and parallel_cuda_test.cpp (a TP/EP group of GPUs):
// - fp32 (--dtype float32, every op in fp32): the reference's greedy ids exactly, every
//   logit within the fixture's tolerance_abs_logit.
// - bf16 (expected.json "bf16", measured from the reference's own bf16 runs): teacher-forced
//   along the reference's greedy tokens, a row fails when its max |dlogit| exceeds T or its
//   top-1 differs from the reference's where the reference's top-1 - top-2 margin exceeds T;
//   the fixture passes when failing rows <= F * rows and rows with the reference's top-1 >=
//   A * rows, over all cases together. Free-running greedy decoding must also match the
//   reference up to the first step whose margin is within T.
// Each prints one OPERR line (op_test_util.h) that scripts/gpu-check.sh tabulates.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "../support/fixture_files.h"
#include "runtime/generate.h"
#include "runtime/model_runner.h"

namespace moonrun::testing {

inline int argmax_of(const float* row, int n) { return static_cast<int>(std::max_element(row, row + n) - row); }

inline float top2_margin(const float* row, int n) {
  float a = -INFINITY, b = -INFINITY;
  for (int i = 0; i < n; ++i) {
    if (row[i] > a) b = a, a = row[i];
    else if (row[i] > b) b = row[i];
  }
  return a - b;
}

inline nlohmann::json fixture_expected(const std::string& dir) {
  std::ifstream in(dir + "/expected.json");
  return nlohmann::json::parse(in);
}

// One case of expected.json with the reference's logits [shape[0], shape[1]].
struct FixtureCase {
  std::vector<int32_t> prompt, want_ids;
  std::vector<int64_t> shape;
  std::vector<float> want;
};
inline FixtureCase fixture_case(const std::string& dir, const nlohmann::json& c) {
  FixtureCase fc;
  fc.prompt = c.at("prompt_ids").get<std::vector<int32_t>>();
  fc.want_ids = c.at("greedy_ids").get<std::vector<int32_t>>();
  fc.shape = c.at("logits_shape").get<std::vector<int64_t>>();
  fc.want = fixtures::read_f32(dir + "/" + c.at("logits_file").get<std::string>(), fc.shape[0] * fc.shape[1]);
  return fc;
}

// `label` names the run in the OPERR line ("k3-tiny-a", "k3-tiny-b tp2 ep1").
inline void expect_fp32_contract(StepRunner& runner, int page_size, const std::string& dir, const std::string& label) {
  const nlohmann::json expected = fixture_expected(dir);
  const float tol = expected.at("tolerance_abs_logit").get<float>();
  int case_index = 0;
  double worst = 0;
  for (const auto& c : expected.at("cases")) {
    SCOPED_TRACE(label + " case " + std::to_string(case_index++));
    const auto [prompt, want_ids, shape, want] = fixture_case(dir, c);
    GenerateOptions opt;
    opt.max_tokens = static_cast<int>(want_ids.size());
    opt.keep_logits = true;
    auto got = generate(runner, page_size, prompt, opt);
    ASSERT_TRUE(got.is_ok()) << got.status().to_string();
    EXPECT_EQ(got->token_ids, want_ids);
    ASSERT_EQ(got->logits.size(), want.size());
    double case_worst = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      const double d = std::fabs(got->logits[i] - want[i]);
      if (!(d <= case_worst)) case_worst = d;
    }
    EXPECT_LE(case_worst, tol) << "prompt of " << prompt.size() << " tokens";
    worst = std::max(worst, case_worst);
  }
  std::printf("OPERR model/%s float32 %.3e %.1e %s\n", label.c_str(), worst, tol, worst <= tol ? "ok" : "FAIL");
}

inline void expect_bf16_contract(StepRunner& runner, int page_size, int vocab, const std::string& dir,
                                 const std::string& label) {
  const nlohmann::json expected = fixture_expected(dir);
  ASSERT_TRUE(expected.contains("bf16")) << dir << "/expected.json has no \"bf16\" tolerance";
  const nlohmann::json& bf = expected.at("bf16");
  const float tol = bf.at("tolerance_abs_logit").get<float>();
  const double max_fail_fraction = bf.at("max_rows_over_tolerance_fraction").get<double>();
  const double min_top1 = bf.at("min_top1_agreement").get<double>();
  const int V = vocab;
  int case_index = 0, rows_total = 0, rows_failed = 0, rows_top1 = 0;
  double worst = 0;
  for (const auto& c : expected.at("cases")) {
    const std::string name = label + "/case" + std::to_string(case_index++);
    SCOPED_TRACE(name);
    const auto [prompt, want_ids, shape, want] = fixture_case(dir, c);

    // Teacher-forced along the reference's tokens.
    GenerateOptions opt;
    opt.max_tokens = static_cast<int>(want_ids.size());
    opt.keep_logits = true;
    opt.forced_ids.assign(want_ids.begin(), want_ids.end() - 1);
    auto forced = generate(runner, page_size, prompt, opt);
    ASSERT_TRUE(forced.is_ok()) << forced.status().to_string();
    ASSERT_EQ(forced->logits.size(), want.size());
    double max_err = 0;
    int failed = 0, top1 = 0;
    for (int64_t r = 0; r < shape[0]; ++r) {
      const float* got_row = forced->logits.data() + r * V;
      const float* want_row = want.data() + r * V;
      double row_err = 0;
      for (int v = 0; v < V; ++v) row_err = std::max(row_err, static_cast<double>(std::fabs(got_row[v] - want_row[v])));
      max_err = std::max(max_err, row_err);
      const int got_top1 = argmax_of(got_row, V);
      const float margin = top2_margin(want_row, V);
      top1 += got_top1 == want_ids[r];
      const bool fail = row_err > tol || (margin > tol && got_top1 != want_ids[r]);
      failed += fail;
      if (fail)  // near misses stay visible
        std::printf("  %s row %lld: max |dlogit| %.3f, top-1 %d (reference %d, margin %.3f)\n", name.c_str(),
                    static_cast<long long>(r), row_err, got_top1, want_ids[r], margin);
    }
    rows_total += static_cast<int>(shape[0]);
    rows_failed += failed;
    rows_top1 += top1;
    worst = std::max(worst, max_err);
    std::printf("OPERR model/%s teacher-forced %.3e %.1e %s (failing rows %d/%lld, top-1 %d/%lld)\n", name.c_str(),
                max_err, tol, failed == 0 ? "ok" : "note", failed, static_cast<long long>(shape[0]), top1,
                static_cast<long long>(shape[0]));

    // Free-running greedy, compared up to the first step whose reference margin is within T.
    GenerateOptions free_opt;
    free_opt.max_tokens = static_cast<int>(want_ids.size());
    auto greedy = generate(runner, page_size, prompt, free_opt);
    ASSERT_TRUE(greedy.is_ok()) << greedy.status().to_string();
    for (size_t k = 0; k < want_ids.size(); ++k) {
      if (top2_margin(want.data() + k * V, V) <= tol) break;
      EXPECT_EQ(greedy->token_ids[k], want_ids[k]) << "greedy step " << k;
      if (greedy->token_ids[k] != want_ids[k]) break;
    }
  }
  const bool ok = rows_failed <= max_fail_fraction * rows_total && rows_top1 >= min_top1 * rows_total;
  std::printf("OPERR model/%s bf16-contract %.3e %.1e %s (failing rows %d/%d <= %.2f; top-1 %d/%d >= %.2f)\n",
              label.c_str(), worst, tol, ok ? "ok" : "FAIL", rows_failed, rows_total, max_fail_fraction, rows_top1,
              rows_total, min_top1);
  EXPECT_LE(rows_failed, max_fail_fraction * rows_total) << rows_failed << " of " << rows_total << " rows fail";
  EXPECT_GE(rows_top1, min_top1 * rows_total) << rows_top1 << " of " << rows_total << " rows have the reference top-1";
}

}  // namespace moonrun::testing
