#pragma once
// Sequences alone and in batches through one runner, for the batching tests of every
// backend (tests/unit/runtime on the CPU, tests/ops on the GPU): 32 prompts of 1..70
// tokens, greedy decoding, each step's logits kept.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "runtime/generate.h"
#include "runtime/model_runner.h"
#include "runtime/sequence_sampler.h"
#include "runtimes.h"

namespace moonrun::testing {

inline std::vector<int32_t> batch_prompt(int i, int vocab) {
  std::vector<int32_t> ids;
  const int n = 1 + (i * 29) % 70;  // 1 .. 70 tokens: single tokens, partial and full KDA chunks
  for (int t = 0; t < n; ++t) ids.push_back((i * 97 + t * 37 + 11) % vocab);
  return ids;
}

// ---- alone vs batched ------------------------------------------------------------------

struct SeqResult {
  std::vector<int32_t> tokens;
  std::vector<float> logits;  // the row each token was picked from, [n, vocab]
};

// Greedy, each sequence alone through generate().
inline std::vector<SeqResult> run_alone(const std::string& dir, int n_seqs, int max_tokens, int vocab,
                                        RuntimeOptions ro) {
  std::vector<SeqResult> out;
  ro.max_running_requests = 1;
  ro.max_total_tokens = 256;
  Runtime rt = make_runtime(dir, ro);
  if (!rt.runner) return out;
  for (int i = 0; i < n_seqs; ++i) {
    GenerateOptions opt;
    opt.max_tokens = max_tokens;
    opt.keep_logits = true;
    auto r = generate(*rt.runner, rt.cache.page_size_tokens, batch_prompt(i, vocab), opt);
    EXPECT_TRUE(r.is_ok()) << r.status().to_string();
    if (!r.is_ok()) break;
    out.push_back({r->token_ids, r->logits});
  }
  return out;
}

// The same sequences through one runner with room for `batch` at a time: each step holds
// every active sequence (its whole prompt when it starts, else its last token), and at most
// two newcomers join per step, so prefills and decodes share steps; a finished sequence's
// slot and pages go to the next one.
inline std::vector<SeqResult> run_batched(const std::string& dir, int n_seqs, int max_tokens, int batch, int vocab,
                                          RuntimeOptions ro, int64_t* graph_replays = nullptr,
                                          int64_t* micro_batches = nullptr) {
  constexpr int kPageSize = 16, kPagesPerSeq = 5;  // 80 >= 70 + 8 tokens
  ro.max_running_requests = batch;
  ro.max_total_tokens = static_cast<int64_t>(batch) * kPagesPerSeq * kPageSize;
  ro.page_size_tokens = kPageSize;
  Runtime rt = make_runtime(dir, ro);
  std::vector<SeqResult> out(n_seqs);
  if (!rt.runner) return out;
  struct Active {
    int seq;
    int n_past = 0;
    std::vector<int32_t> pages;
  };
  std::vector<int> free_slots;
  for (int s = batch - 1; s >= 0; --s) free_slots.push_back(s);
  std::map<int, Active> active;  // by slot
  int next = 0;
  while (next < n_seqs || !active.empty()) {
    StepInput in;
    in.return_logits = true;
    std::vector<std::vector<int32_t>> fed;  // each sequence's tokens this step
    fed.reserve(batch);
    for (int joined = 0; joined < 2 && next < n_seqs && !free_slots.empty(); ++joined) {
      const int slot = free_slots.back();
      free_slots.pop_back();
      Active a{next++, 0, {}};
      // Under DP attention the pages of the slot's group (CacheConfig::page_groups).
      const int groups = std::max(rt.cache.page_groups, 1), group_pages = rt.cache.num_pages / groups;
      for (int p = 0; p < kPagesPerSeq; ++p)
        a.pages.push_back((slot % groups) * group_pages + (slot / groups) * kPagesPerSeq + p);
      in.before.push_back({-1, slot});
      active.emplace(slot, std::move(a));
    }
    std::vector<int> order;
    for (auto& [slot, a] : active) {
      const SeqResult& r = out[a.seq];
      fed.push_back(r.tokens.empty() ? batch_prompt(a.seq, vocab) : std::vector<int32_t>{r.tokens.back()});
      StepSeq s;
      s.new_token_ids = fed.back();
      s.n_past = a.n_past;
      s.state_slot = slot;
      s.pages = a.pages;
      s.sample = true;
      in.seqs.push_back(s);
      SamplingParams greedy;
      greedy.temperature = 0;
      SequenceSampler(greedy, 0, {}).add_row(in.sampling, 0, {});
      order.push_back(slot);
    }
    StepOutput res;
    const Status st = rt.runner->step(in, res);
    EXPECT_TRUE(st.is_ok()) << st.to_string();
    if (!st.is_ok()) break;
    for (size_t i = 0; i < order.size(); ++i) {
      Active& a = active.at(order[i]);
      SeqResult& r = out[a.seq];
      a.n_past += static_cast<int>(in.seqs[i].new_token_ids.size());
      r.tokens.push_back(res.samples[i].token);
      r.logits.insert(r.logits.end(), res.logits.begin() + i * vocab, res.logits.begin() + (i + 1) * vocab);
      if (static_cast<int>(r.tokens.size()) == max_tokens) {
        free_slots.push_back(order[i]);
        active.erase(order[i]);
      }
    }
  }
  if (graph_replays) *graph_replays = rt.runner->stats().graph_replays;
  if (micro_batches) *micro_batches = rt.runner->stats().micro_batches;
  return out;
}

}  // namespace moonrun::testing
