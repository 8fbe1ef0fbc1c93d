// sample_rows against the CPU sampler (cpu::sample_row in backend/cpu/sample.cpp, no
// penalties, no logprobs): given the same logits, parameters and uniform draw it must pick
// the same token, row for row. The draw u is the CPU's own: SamplerRng(seed).uniform().
// Shapes (rows x vocab): K3's 8 x 163840, 64 x 1000, 16 x 7, 4 x 1; each through greedy,
// temperature (1, 0.7, 0.05), min_p, top-k (1, 50, vocab - 1, -1 = off), top-p (0.9, 0.437,
// 0.01, 0.999999) and their combination, on normal logits, on small-integer logits (many
// exact ties: greedy's lowest id, the top-k boundary and the top-p cut inside a run of equal
// logits) and on rows with -inf entries.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "backend/cpu/sample.h"
#include "runtime/sequence_sampler.h"
#include "backend/cuda/common/device_buffer.h"
#include "backend/cuda/sample/sample_ops.h"
#include "op_test_util.h"
#include "core_inputs.h"

namespace moonrun::cuda {
namespace {

using optest::expect_exact;
using optest::shape_str;

struct Config {
  const char* name;
  float temperature;
  int top_k;
  float top_p;
  float min_p;
};

const Config kConfigs[] = {
    {"greedy", 0.0f, 0, 1.0f, 0.0f},
    {"temp1", 1.0f, 0, 1.0f, 0.0f},
    {"temp0.7", 0.7f, 0, 1.0f, 0.0f},
    {"min_p0.05", 1.0f, 0, 1.0f, 0.05f},
    {"min_p0.3_temp1.5", 1.5f, 0, 1.0f, 0.3f},
    {"top_k1", 1.0f, 1, 1.0f, 0.0f},
    {"top_k50", 0.8f, 50, 1.0f, 0.0f},
    {"top_k_vocab-1", 1.0f, -2, 1.0f, 0.0f},  // -2: vocab - 1
    {"top_k-1_off", 1.0f, -1, 1.0f, 0.0f},
    {"top_p0.9", 1.0f, 0, 0.9f, 0.0f},
    {"top_p0.437", 0.6f, 0, 0.437f, 0.0f},
    {"top_p0.01", 1.0f, 0, 0.01f, 0.0f},
    {"temp0.05_top_p0.9", 0.05f, 0, 0.9f, 0.0f},  // most masses underflow to exactly 0
    {"top_p0.999999", 1.0f, 0, 0.999999f, 0.0f},  // the cut deep in the tail
    {"all", 1.3f, 40, 0.8f, 0.02f},
    {"all_tight", 0.9f, 5, 0.437f, 0.1f},
};

enum class Logits { kNormal, kSmallInts, kWithNegInf };

std::vector<float> make_logits(Logits kind, int n_rows, int vocab, uint64_t seed) {
  const size_t n = static_cast<size_t>(n_rows) * vocab;
  switch (kind) {
    case Logits::kNormal:
      return optest::random_normal(n, seed, 3.0f);
    case Logits::kSmallInts:
      return optest::fast_small_ints(n, seed, -4, 2);
    case Logits::kWithNegInf: {
      auto x = optest::random_normal(n, seed, 2.0f);
      for (size_t i = 0; i < n; i += 3) x[i] = -std::numeric_limits<float>::infinity();
      return x;
    }
  }
  return {};
}

void check(int n_rows, int vocab, Logits kind, const Config& cfg, uint64_t seed) {
  const char* kind_name = kind == Logits::kNormal ? "normal" : kind == Logits::kSmallInts ? "ints" : "neginf";
  const std::string shape = shape_str({n_rows, vocab}) + "_" + kind_name + "_" + cfg.name;
  const auto logits = make_logits(kind, n_rows, vocab, seed);
  std::vector<DeviceSamplingParams> dparams(n_rows);
  std::vector<float> want(n_rows);
  for (int r = 0; r < n_rows; ++r) {
    SamplingParams p;
    p.temperature = cfg.temperature;
    p.top_k = cfg.top_k == -2 ? vocab - 1 : cfg.top_k;
    p.top_p = cfg.top_p;
    p.min_p = cfg.min_p;
    const uint64_t rng_seed = seed * 1000 + r;
    SamplingBatch b;
    SequenceSampler(p, rng_seed, {}).add_row(b, 0, {});
    want[r] = static_cast<float>(cpu::sample_row(logits.data() + static_cast<size_t>(r) * vocab, vocab, b.rows[0], b).token);
    dparams[r] = DeviceSamplingParams{p.temperature, p.top_k, p.top_p, p.min_p, b.rows[0].u};
  }
  // Two edge draws: u = 0 (the first id with mass) and u just below 1 (the last, or the
  // fallback when rounding leaves u above the total).
  if (n_rows >= 3 && cfg.temperature >= 1e-5f) {
    for (int r : {0, 1}) {
      dparams[r].u = r == 0 ? 0.0 : 1.0 - 0x1.0p-53;
      SamplingBatch b;
      SamplingRow row;
      row.temperature = dparams[r].temperature;
      row.top_k = dparams[r].top_k;
      row.top_p = dparams[r].top_p;
      row.min_p = dparams[r].min_p;
      b.rows.push_back(row);
      // The CPU path draws from its generator; recover the same token from its distribution.
      const auto dist = cpu::sampling_distribution(logits.data() + static_cast<size_t>(r) * vocab, vocab, row, b);
      double cumulative = 0;
      int token = -1, last = 0;
      for (int i = 0; i < vocab; ++i) {
        if (dist[i] <= 0) continue;
        last = i;
        cumulative += dist[i];
        if (dparams[r].u < cumulative) {
          token = i;
          break;
        }
      }
      want[r] = static_cast<float>(token < 0 ? last : token);
    }
  }
  DeviceBuffer<float> d_logits(logits);
  DeviceBuffer<DeviceSamplingParams> d_params(dparams);
  DeviceBuffer<int32_t> d_ids(n_rows);
  const auto t0 = std::chrono::steady_clock::now();
  sample_rows(d_logits.data(), n_rows, vocab, d_params.data(), d_ids.data(), nullptr);
  CUDA_CHECK(cudaDeviceSynchronize());
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  if (vocab >= 100000) std::printf("sample_rows %s: %.3f ms\n", shape.c_str(), ms);
  std::vector<float> got;
  for (int32_t id : d_ids.download()) got.push_back(static_cast<float>(id));
  expect_exact("sample_rows", shape, got, want);
}

class SampleTest : public ::testing::TestWithParam<std::pair<int, int>> {};

TEST_P(SampleTest, MatchesCpuSampler) {
  REQUIRE_GPU();
  const auto [n_rows, vocab] = GetParam();
  std::printf("sample_rows shape rows x vocab = %s\n", shape_str({n_rows, vocab}).c_str());
  uint64_t seed = 1;
  for (Logits kind : {Logits::kNormal, Logits::kSmallInts, Logits::kWithNegInf})
    for (const Config& cfg : kConfigs) check(n_rows, vocab, kind, cfg, seed++);
}

INSTANTIATE_TEST_SUITE_P(Shapes, SampleTest,
                         ::testing::Values(std::pair{8, 163840}, std::pair{64, 1000}, std::pair{16, 7},
                                           std::pair{4, 1}),
                         [](const auto& info) { return shape_str({info.param.first, info.param.second}); });

// A row whose every logit is -inf has no mass: the CPU's draw falls back to id 0.
TEST(SampleOpsTest, AllNegInfRowPicksZero) {
  REQUIRE_GPU();
  std::printf("sample_rows shape rows x vocab = 2x33 (all -inf)\n");
  const std::vector<float> logits(2 * 33, -std::numeric_limits<float>::infinity());
  std::vector<DeviceSamplingParams> params{{0.0f, 0, 1.0f, 0.0f, 0.5}, {1.0f, 3, 0.5f, 0.1f, 0.5}};
  DeviceBuffer<float> d_logits(logits);
  DeviceBuffer<DeviceSamplingParams> d_params(params);
  DeviceBuffer<int32_t> d_ids(2);
  sample_rows(d_logits.data(), 2, 33, d_params.data(), d_ids.data(), nullptr);
  CUDA_CHECK(cudaDeviceSynchronize());
  const auto ids = d_ids.download();
  EXPECT_EQ(ids[0], 0);
  EXPECT_EQ(ids[1], 0);
}

// ---- argmax_rows: greedy batches (argmax.cu) ----------------------------------------------

// Rows with planted maxima: the id argmax_rows must return is the CPU's (std::max_element:
// the lowest id among equal maxima) and the one sample_rows' greedy branch returns. The
// kernel cuts a row into 4096-logit blocks (K3's vocab: 40), so ties are planted within one
// block, across blocks, and on both sides of a block boundary.
std::vector<float> planted_rows(int n_rows, int vocab, uint64_t seed, std::vector<int>* want) {
  auto logits = optest::random_normal(static_cast<size_t>(n_rows) * vocab, seed, 3.0f);
  const float inf = std::numeric_limits<float>::infinity();
  want->assign(n_rows, -1);
  for (int r = 0; r < n_rows; ++r) {
    float* row = logits.data() + static_cast<size_t>(r) * vocab;
    auto plant = [&](std::initializer_list<int> ids, float value) {
      for (int i : ids)
        if (i >= 0 && i < vocab) row[i] = value;
    };
    switch (r % 9) {
      case 0:  // the same maximum in three blocks: the first wins
        plant({5000, 100000, vocab - 1}, 100.0f);
        break;
      case 1:  // a tie across the block boundary at 4096, another later
        plant({4095, 4096, 8191}, 100.0f);
        break;
      case 2:  // one maximum, the last id
        plant({vocab - 1}, 100.0f);
        break;
      case 3:  // the first id
        plant({0, vocab / 2}, 100.0f);
        break;
      case 4:  // small integers: thousands of ties at the top value
        for (int i = 0; i < vocab; ++i) row[i] = static_cast<float>(static_cast<int>(std::fabs(row[i])) % 5);
        break;
      case 5:  // every logit -inf (a fully masked row): id 0
        for (int i = 0; i < vocab; ++i) row[i] = -inf;
        break;
      case 6:  // mostly -inf, the maximum -inf-adjacent values tied: 7 and 9 hold -1
        for (int i = 0; i < vocab; ++i) row[i] = -inf;
        plant({9, 7}, -1.0f);
        break;
      case 7:  // -0 and +0 are equal maxima: the lower id, whatever its sign
        for (int i = 0; i < vocab; ++i) row[i] = -1.0f;
        plant({vocab - 3}, 0.0f);
        plant({vocab / 3}, -0.0f);
        break;
      case 8:  // +inf ties
        plant({vocab / 4 + 1, vocab / 4}, inf);
        break;
    }
    want->at(r) = static_cast<int>(std::max_element(row, row + vocab) - row);
  }
  return logits;
}

class ArgmaxTest : public ::testing::TestWithParam<std::pair<int, int>> {};

TEST_P(ArgmaxTest, MatchesCpuAndSampleRows) {
  REQUIRE_GPU();
  const auto [n_rows, vocab] = GetParam();
  const std::string shape = shape_str({n_rows, vocab});
  std::printf("argmax_rows shape rows x vocab = %s\n", shape.c_str());
  std::vector<int> want;
  const auto logits = planted_rows(n_rows, vocab, 7 + vocab, &want);
  DeviceBuffer<float> d_logits(logits);
  DeviceBuffer<ArgmaxPartial> d_partials(static_cast<size_t>(argmax_partials(n_rows, vocab)));
  DeviceBuffer<int32_t> d_ids(n_rows), d_sample_ids(n_rows);
  argmax_rows(d_logits.data(), n_rows, vocab, d_partials.data(), d_ids.data(), nullptr);
  CUDA_CHECK(cudaDeviceSynchronize());
  // The greedy branch of sample_rows, the path every greedy row took before.
  DeviceBuffer<DeviceSamplingParams> d_params{std::vector<DeviceSamplingParams>(n_rows)};
  sample_rows(d_logits.data(), n_rows, vocab, d_params.data(), d_sample_ids.data(), nullptr);
  CUDA_CHECK(cudaDeviceSynchronize());
  const auto ids = d_ids.download(), sample_ids = d_sample_ids.download();
  std::vector<float> got, cpu, old;
  for (int r = 0; r < n_rows; ++r) {
    got.push_back(static_cast<float>(ids[r]));
    cpu.push_back(static_cast<float>(want[r]));
    old.push_back(static_cast<float>(sample_ids[r]));
  }
  expect_exact("argmax_rows_vs_cpu", shape, got, cpu);
  expect_exact("argmax_rows_vs_sample_rows", shape, got, old);
  if (vocab >= 100000) {
    // Steady state, both kernels (the sampler's share of a decode step).
    cudaEvent_t start, stop;
    CUDA_CHECK(cudaEventCreate(&start));
    CUDA_CHECK(cudaEventCreate(&stop));
    const auto time_ms = [&](auto&& launch) {
      launch();
      CUDA_CHECK(cudaEventRecord(start, nullptr));
      for (int i = 0; i < 20; ++i) launch();
      CUDA_CHECK(cudaEventRecord(stop, nullptr));
      CUDA_CHECK(cudaEventSynchronize(stop));
      float ms = 0;
      CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
      return ms / 20;
    };
    const float argmax_ms = time_ms(
        [&] { argmax_rows(d_logits.data(), n_rows, vocab, d_partials.data(), d_ids.data(), nullptr); });
    const float sample_ms = time_ms(
        [&] { sample_rows(d_logits.data(), n_rows, vocab, d_params.data(), d_sample_ids.data(), nullptr); });
    std::printf("argmax_rows %s: %.4f ms per call; sample_rows (greedy) %.4f ms\n", shape.c_str(), argmax_ms,
                sample_ms);
    CUDA_CHECK(cudaEventDestroy(start));
    CUDA_CHECK(cudaEventDestroy(stop));
  }
}

// K3's vocab at batch 1 and 8 (every planted pattern at 9 rows), a vocab that is not a
// multiple of 4 (rows not 16-byte aligned: the scalar path), one block's worth, tiny rows.
INSTANTIATE_TEST_SUITE_P(Shapes, ArgmaxTest,
                         ::testing::Values(std::pair{1, 163840}, std::pair{8, 163840}, std::pair{9, 163840},
                                           std::pair{9, 163837}, std::pair{9, 4096}, std::pair{9, 4097},
                                           std::pair{9, 1000}, std::pair{4, 7}, std::pair{2, 1}),
                         [](const auto& info) { return shape_str({info.param.first, info.param.second}); });

// NaN logits: sample_rows' max (fmaxf) skips them and so does argmax_rows; a row of NaN only
// gives 0. (The CPU's std::max_element is not defined on NaN: no CPU comparison here.)
TEST(SampleOpsTest, ArgmaxSkipsNanLikeSampleRows) {
  REQUIRE_GPU();
  std::printf("argmax_rows shape rows x vocab = 3x9000 (NaN)\n");
  const int vocab = 9000;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> logits(3 * vocab, 1.0f);
  logits[0] = nan;
  logits[4500] = 2.0f;
  logits[4501] = nan;
  logits[vocab + 8999] = 5.0f;
  for (int i = 0; i < vocab; i += 2) logits[vocab + i] = nan;
  for (int i = 0; i < vocab; ++i) logits[2 * vocab + i] = nan;
  DeviceBuffer<float> d_logits(logits);
  DeviceBuffer<ArgmaxPartial> d_partials(static_cast<size_t>(argmax_partials(3, vocab)));
  DeviceBuffer<int32_t> d_ids(3), d_old(3);
  DeviceBuffer<DeviceSamplingParams> d_params{std::vector<DeviceSamplingParams>(3)};
  argmax_rows(d_logits.data(), 3, vocab, d_partials.data(), d_ids.data(), nullptr);
  sample_rows(d_logits.data(), 3, vocab, d_params.data(), d_old.data(), nullptr);
  CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_EQ(d_ids.download(), (std::vector<int32_t>{4500, 8999, 0}));
  EXPECT_EQ(d_ids.download(), d_old.download());
}

}  // namespace
}  // namespace moonrun::cuda
