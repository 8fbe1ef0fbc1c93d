#include "engine/spec_balance.h"

#include <algorithm>
#include <bit>

namespace moonrun {

int SpecBalance::bucket_of(int decoding) {
  const unsigned n = static_cast<unsigned>(std::max(decoding, 1));
  return std::min(static_cast<int>(std::bit_width(n)) - 1, kBuckets - 1);
}

bool SpecBalance::speculate(int decoding) {
  Bucket& b = buckets_[bucket_of(decoding)];
  ++b.decisions;
  if (b.n[1] < kWarmSteps) return true;   // learn what drafts give first
  if (b.n[0] < kWarmSteps) return false;  // then what plain steps give
  const bool better = b.tokens[1] * b.seconds[0] >= b.tokens[0] * b.seconds[1];
  return b.decisions % kExploreEvery == 0 ? !better : better;
}

void SpecBalance::record(int decoding, bool speculated, int64_t tokens, double seconds) {
  if (tokens <= 0 || seconds <= 0) return;
  Bucket& b = buckets_[bucket_of(decoding)];
  const int k = speculated ? 1 : 0;
  b.tokens[k] = kDecay * b.tokens[k] + static_cast<double>(tokens);
  b.seconds[k] = kDecay * b.seconds[k] + seconds;
  ++b.n[k];
}

double SpecBalance::rate(int decoding, bool speculated) const {
  const Bucket& b = buckets_[bucket_of(decoding)];
  const int k = speculated ? 1 : 0;
  return b.seconds[k] > 0 ? b.tokens[k] / b.seconds[k] : 0;
}

}  // namespace moonrun
