// Every reference fixture (tests/fixtures) through the CUDA model, the GPU counterpart of
// tests/model/fixtures_test.cpp. The CUDA backend computes with bf16 storage, so it is held
// to the fixture's bf16 contract (expected.json "bf16", tests/fixtures/README.md "The bf16
// tolerance", measured from the reference's own bf16 runs), teacher-forced along the
// reference's greedy tokens: a row fails when its max |dlogit| exceeds T or its top-1
// differs from the reference's where the reference's top-1 - top-2 margin exceeds T; the
// fixture passes when failing rows <= F * rows and rows with the reference's top-1 >=
// A * rows, over all cases together. Free-running greedy decoding must also match the
// reference up to the first step whose margin is within T.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "../support/fixture_files.h"
#include "model/generate.h"
#include "model/kimi_k3.h"
#include "op_test_util.h"
#include "runtime/cuda/cuda_model_runner.h"

namespace moonrun {
namespace {


using fixtures::fixture_names;
using fixtures::fixtures_dir;
using fixtures::read_f32;

int argmax(const float* row, int n) { return static_cast<int>(std::max_element(row, row + n) - row); }

float top2_margin(const float* row, int n) {
  float a = -INFINITY, b = -INFINITY;
  for (int i = 0; i < n; ++i) {
    if (row[i] > a) b = a, a = row[i];
    else if (row[i] > b) b = row[i];
  }
  return a - b;
}

class CudaFixture : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaFixture, TeacherForcedLogitsAndGreedyIdsWithinTheBf16Tolerance) {
  REQUIRE_GPU();
  const std::string dir = fixtures_dir() + "/" + GetParam();
  std::ifstream in(dir + "/expected.json");
  const nlohmann::json expected = nlohmann::json::parse(in);
  ASSERT_TRUE(expected.contains("bf16")) << dir << "/expected.json has no \"bf16\" tolerance";
  const nlohmann::json& bf = expected.at("bf16");
  const float tol = bf.at("tolerance_abs_logit").get<float>();
  const double max_fail_fraction = bf.at("max_rows_over_tolerance_fraction").get<double>();
  const double min_top1 = bf.at("min_top1_agreement").get<double>();
  WeightLoadOptions load;
  load.mxfp4_packed = true;
  auto model = KimiK3Model::load(dir, load);
  ASSERT_TRUE(model.is_ok()) << model.status().to_string();
  const int V = (*model)->config().vocab_size;
  CudaDeviceOptions dev;
  dev.mem_fraction_static = 0.2;

  int case_index = 0, rows_total = 0, rows_failed = 0, rows_top1 = 0;
  double worst = 0;
  for (const auto& c : expected.at("cases")) {
    const std::string name = GetParam() + "/case" + std::to_string(case_index++);
    SCOPED_TRACE(name);
    const auto prompt = c.at("prompt_ids").get<std::vector<int32_t>>();
    const auto want_ids = c.at("greedy_ids").get<std::vector<int32_t>>();
    const auto shape = c.at("logits_shape").get<std::vector<int64_t>>();
    const auto want = read_f32(dir + "/" + c.at("logits_file").get<std::string>(), shape[0] * shape[1]);

    // Teacher-forced along the reference's tokens.
    GenerateOptions opt;
    opt.max_tokens = static_cast<int>(want_ids.size());
    opt.keep_logits = true;
    opt.forced_ids.assign(want_ids.begin(), want_ids.end() - 1);
    auto forced = generate_cuda(**model, prompt, opt, dev);
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
      const int got_top1 = argmax(got_row, V);
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
    auto greedy = generate_cuda(**model, prompt, free_opt, dev);
    ASSERT_TRUE(greedy.is_ok()) << greedy.status().to_string();
    for (size_t k = 0; k < want_ids.size(); ++k) {
      if (top2_margin(want.data() + k * V, V) <= tol) break;
      EXPECT_EQ(greedy->token_ids[k], want_ids[k]) << "greedy step " << k;
      if (greedy->token_ids[k] != want_ids[k]) break;
    }
  }
  const bool ok = rows_failed <= max_fail_fraction * rows_total && rows_top1 >= min_top1 * rows_total;
  std::printf("OPERR model/%s bf16-contract %.3e %.1e %s (failing rows %d/%d <= %.2f; top-1 %d/%d >= %.2f)\n",
              GetParam().c_str(), worst, tol, ok ? "ok" : "FAIL", rows_failed, rows_total, max_fail_fraction,
              rows_top1, rows_total, min_top1);
  EXPECT_LE(rows_failed, max_fail_fraction * rows_total) << rows_failed << " of " << rows_total << " rows fail";
  EXPECT_GE(rows_top1, min_top1 * rows_total) << rows_top1 << " of " << rows_total << " rows have the reference top-1";
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaFixture, ::testing::ValuesIn(fixture_names()),
                         [](const auto& info) {
                           std::string s = info.param;
                           std::replace(s.begin(), s.end(), '-', '_');
                           return s;
                         });

}  // namespace
}  // namespace moonrun
