#pragma once
// Whether speculation pays at the current batch size, learned from the engine's own steps.
//
// A verify step costs more than a decode step (1 + k tokens a sequence, a rollback when a
// draft is rejected), and pays back in accepted drafts. Which wins depends on the batch: on
// an H100 the demo model's verify step at k = 4 costs 1.66x a decode step at batch 1 and
// 2.25x at batch 32 (docs/performance.md), so n-gram drafts that yield 1.9 tokens a step
// gain a little alone and lose 30% over 32 streams. vLLM leaves this to a fixed
// disable_by_batch_size; moonrun measures it: per batch-size bucket (1, 2-3, 4-7, ...) it
// keeps the tokens per second of pure decode steps with drafts and without, runs the better
// one, and every kExploreEvery-th step of a bucket tries the other (workloads change). A step
// where speculation was on but no sequence found a draft is measured as a plain step (it is
// one): speculation's rate is that of the steps that verified drafts.
#include <array>
#include <cstdint>

namespace moonrun {

class SpecBalance {
 public:
  static constexpr int kBuckets = 16;
  static constexpr int kWarmSteps = 4;      // steps of each kind before a verdict
  static constexpr int kExploreEvery = 32;  // then one step of the losing kind in this many
  // The rates are decayed sums (tokens over seconds, each step's weight falling by this
  // factor per later step of its kind): one step's acceptance is noisy (0..k drafts).
  static constexpr double kDecay = 0.97;

  // Speculate this step, with `decoding` sequences decoding?
  bool speculate(int decoding);
  // A pure decode step (no prefill chunk in it) of `decoding` sequences ran, with drafts or
  // without, and produced `tokens` tokens in `seconds`.
  void record(int decoding, bool speculated, int64_t tokens, double seconds);
  // Tokens per second measured in the bucket of `decoding` (0 until measured).
  double rate(int decoding, bool speculated) const;

 private:
  struct Bucket {
    double tokens[2] = {0, 0};  // [plain, speculated], decayed sums
    double seconds[2] = {0, 0};
    int64_t n[2] = {0, 0};
    int64_t decisions = 0;
  };
  static int bucket_of(int decoding);
  std::array<Bucket, kBuckets> buckets_{};
};

}  // namespace moonrun
