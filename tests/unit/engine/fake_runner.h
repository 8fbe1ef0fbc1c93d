#pragma once
// A stand-in for the model: the logits of a sequence are a fixed function of its token ids.
// The runner keeps one row per page slot ([token id, position]) and a running digest per
// state slot, reads each sequence back through its page table and checks it against its
// slot, so a wrong page table, a missed slot reset, a wrong snapshot restore or a slot
// shared by two sequences fails the step instead of going unnoticed. Tokens are picked by
// the real CPU sampler (backend/cpu/sample.h) from the step's sampling rows.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "backend/cpu/sample.h"
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

class FakeRunner : public StepRunner {
 public:
  FakeRunner(int num_pages, int page_size, int num_slots, int vocab)
      : page_size_(page_size), rows_(static_cast<size_t>(num_pages) * page_size), slots_(num_slots), vocab_(vocab) {}

  int vocab() const override { return vocab_; }

  Status step(const StepInput& in, StepOutput& out) override {
    const int forward_index = ++num_forwards;
    if (forward_delay.count() > 0) std::this_thread::sleep_for(forward_delay);
    max_batch_seqs = std::max(max_batch_seqs, static_cast<int>(in.seqs.size()));
    out.samples.clear();
    out.logits.clear();
    const int fail_after = fail_at_forward.load();
    if (fail_after >= 0 && forward_index > fail_after) return internal_error("fake backend failure");
    for (const StateCopy& c : in.before) {
      if (c.dst < 0 || c.dst >= static_cast<int>(slots_.size())) return internal_error("bad state copy");
      slots_[c.dst] = c.src < 0 ? Slot{} : slots_.at(c.src);
      if (c.src < 0) ++num_resets;
      else ++num_restores;
    }
    std::vector<float> logits(vocab_);
    size_t row = 0;
    for (size_t i = 0; i < in.seqs.size(); ++i) {
      const StepSeq& s = in.seqs[i];
      if (s.state_slot < 0 || s.state_slot >= static_cast<int>(slots_.size())) return internal_error("bad slot");
      Slot& slot = slots_[s.state_slot];
      if (slot.n_tokens != s.n_past)
        return internal_error("slot " + std::to_string(s.state_slot) + " holds " + std::to_string(slot.n_tokens) +
                              " tokens, batch says n_past " + std::to_string(s.n_past));
      const int n_total = s.n_past + static_cast<int>(s.new_token_ids.size());
      if (static_cast<int64_t>(s.pages.size()) * page_size_ < n_total) return internal_error("short page table");
      for (size_t t = 0; t < s.new_token_ids.size(); ++t) {
        const int pos = s.n_past + static_cast<int>(t);
        Row& r = rows_.at(static_cast<size_t>(s.pages[pos / page_size_]) * page_size_ + pos % page_size_);
        r = Row{s.new_token_ids[t], pos};
        slot.digest = mix(slot.digest, s.new_token_ids[t]);
        ++slot.n_tokens;
      }
      // Read the whole sequence back from the pages: it must agree with the slot.
      uint64_t digest = kDigestInit;
      for (int pos = 0; pos < n_total; ++pos) {
        const Row& r = rows_.at(static_cast<size_t>(s.pages[pos / page_size_]) * page_size_ + pos % page_size_);
        if (r.pos != pos) return internal_error("page row holds another position");
        digest = mix(digest, r.token);
      }
      if (digest != slot.digest) return internal_error("KV pages and state slot disagree");
      if (!s.sample) continue;
      fake_logits(digest, vocab_, logits.data());
      if (row >= in.sampling.rows.size()) return internal_error("missing sampling row");
      out.samples.push_back(cpu::sample_row(logits.data(), vocab_, in.sampling.rows[row++], in.sampling));
    }
    for (const StateCopy& c : in.after) slots_.at(c.dst) = slots_.at(c.src);
    num_snapshots += static_cast<int>(in.after.size());
    return Status::ok();
  }

  std::atomic<int> num_forwards{0};
  int num_resets = 0;
  int num_restores = 0;
  int num_snapshots = 0;
  int max_batch_seqs = 0;
  std::atomic<int> fail_at_forward{-1};  // >= 0: forwards after this many fail (any thread may set it)
  std::chrono::microseconds forward_delay{0};  // a slower model, for the threaded tests

 private:
  struct Slot {
    uint64_t digest = kDigestInit;
    int n_tokens = 0;
  };
  struct Row {
    int32_t token = -1;
    int pos = -1;
  };
  int page_size_;
  std::vector<Row> rows_;
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
