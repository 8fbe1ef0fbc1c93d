#pragma once
// A stand-in for the model: the logits of a sequence are a fixed function of its token ids,
// and the runner reads those ids back through the paged MLA pool and keeps a running digest
// in its KDA slot, so a wrong page table, a missed slot reset or a slot shared by two
// sequences changes the outputs (or fails the forward) instead of going unnoticed.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>
#include <string>
#include <vector>

#include "common/status.h"
#include "runtime/model_runner.h"

namespace moonrun::testing {

inline uint64_t mix(uint64_t h, uint64_t x) {  // splitmix64 of (h ^ x)
  uint64_t z = h ^ (x + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2));
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
constexpr uint64_t kDigestInit = 0x1234567ull;

// The reference: logits of the next token after `tokens`.
inline void fake_logits(uint64_t digest, int vocab, float* out) {
  for (int v = 0; v < vocab; ++v) out[v] = static_cast<float>(mix(digest, v) >> 44) / 4096.0f;  // [0, 256)
}
inline uint64_t digest_of(const std::vector<int32_t>& tokens) {
  uint64_t h = kDigestInit;
  for (int32_t t : tokens) h = mix(h, t);
  return h;
}

class FakeRunner : public ModelRunner {
 public:
  FakeRunner(MlaPoolView pool, int num_slots, int vocab) : pool_(pool), slots_(num_slots), vocab_(vocab) {}

  int vocab() const override { return vocab_; }
  void reset_kda_slot(int slot) override { slots_.at(slot) = Slot{}; ++num_resets; }

  Status forward(const ForwardBatch& batch, std::vector<float>& logits) override {
    const int forward_index = ++num_forwards;
    if (forward_delay.count() > 0) std::this_thread::sleep_for(forward_delay);
    max_batch_seqs = std::max(max_batch_seqs, static_cast<int>(batch.seqs.size()));
    logits.assign(static_cast<size_t>(batch.n_logit_rows()) * vocab_, 0.0f);
    const int fail_after = fail_at_forward.load();
    if (fail_after >= 0 && forward_index > fail_after) return internal_error("fake backend failure");
    for (size_t i = 0; i < batch.seqs.size(); ++i) {
      const ForwardSeq& s = batch.seqs[i];
      if (s.kda_slot < 0 || s.kda_slot >= static_cast<int>(slots_.size())) return internal_error("bad slot");
      Slot& slot = slots_[s.kda_slot];
      if (slot.n_tokens != s.n_past_tokens)
        return internal_error("slot " + std::to_string(s.kda_slot) + " holds " + std::to_string(slot.n_tokens) +
                              " tokens, batch says n_past " + std::to_string(s.n_past_tokens));
      const int n_total = s.n_past_tokens + static_cast<int>(s.new_token_ids.size());
      if (static_cast<int64_t>(s.pages.size()) * pool_.page_size_tokens < n_total) return internal_error("short page table");
      for (size_t t = 0; t < s.new_token_ids.size(); ++t) {
        const int pos = s.n_past_tokens + static_cast<int>(t);
        float* row = pool_.row(0, s.pages[pos / pool_.page_size_tokens], pos % pool_.page_size_tokens);
        row[0] = static_cast<float>(s.new_token_ids[t]);
        row[1] = static_cast<float>(pos);
        slot.digest = mix(slot.digest, s.new_token_ids[t]);
        ++slot.n_tokens;
      }
      // Read the whole sequence back from the pages: it must agree with the slot.
      uint64_t digest = kDigestInit;
      for (int pos = 0; pos < n_total; ++pos) {
        const float* row = pool_.row(0, s.pages[pos / pool_.page_size_tokens], pos % pool_.page_size_tokens);
        if (row[1] != static_cast<float>(pos)) return internal_error("page row holds another position");
        digest = mix(digest, static_cast<int32_t>(row[0]));
      }
      if (digest != slot.digest) return internal_error("MLA pages and KDA slot disagree");
      fake_logits(digest, vocab_, logits.data() + i * vocab_);
    }
    return Status::ok();
  }

  std::atomic<int> num_forwards{0};
  int num_resets = 0;
  int max_batch_seqs = 0;
  std::atomic<int> fail_at_forward{-1};  // >= 0: forwards after this many fail (any thread may set it)
  std::chrono::microseconds forward_delay{0};  // a slower model, for the threaded tests

 private:
  struct Slot {
    uint64_t digest = kDigestInit;
    int n_tokens = 0;
  };
  MlaPoolView pool_;  // 1 layer, rows of 2 floats: [token id, position]
  std::vector<Slot> slots_;
  int vocab_;
};

// Greedy generation straight from the definition of the fake model, no engine involved.
inline std::vector<int32_t> reference_greedy(std::vector<int32_t> tokens, int vocab, int max_tokens,
                                             int32_t eos, bool* hit_eos = nullptr) {
  std::vector<int32_t> out;
  std::vector<float> logits(vocab);
  if (hit_eos) *hit_eos = false;
  while (static_cast<int>(out.size()) < max_tokens) {
    fake_logits(digest_of(tokens), vocab, logits.data());
    int32_t best = 0;
    for (int v = 1; v < vocab; ++v)
      if (logits[v] > logits[best]) best = v;
    out.push_back(best);
    tokens.push_back(best);
    if (best == eos) {
      if (hit_eos) *hit_eos = true;
      break;
    }
  }
  return out;
}

}  // namespace moonrun::testing
