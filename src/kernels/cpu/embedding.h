#pragma once
// Token embeddings: out[t] = table[ids[t]].
#include <algorithm>
#include <cstdint>

namespace moonrun::cpu {

// table: [vocab, hidden]; ids must be < vocab (checked by the caller); out: [n_tokens, hidden].
inline void embed_tokens(const float* table, int hidden, const int32_t* ids, int n_tokens, float* out) {
  for (int t = 0; t < n_tokens; ++t) {
    const float* row = table + static_cast<int64_t>(ids[t]) * hidden;
    std::copy(row, row + hidden, out + static_cast<int64_t>(t) * hidden);
  }
}

}  // namespace moonrun::cpu
