#pragma once
// One step's batch, flat (SGLang's ForwardBatch): the new tokens of every scheduled sequence
// concatenated, prefill chunks and decode tokens mixed, with what the attention ops need to
// find each sequence's caches. Built once per step by the runner (runtime/) from the
// scheduler's choice and passed explicitly to the model and every op; no global context.
//
// ForwardBatch is the host form. BatchView adds its copy in the backend's memory (uploaded
// once per step by Ops::upload_batch): kernels read the per-token and per-sequence tables
// from there, so a captured CUDA graph replays with new contents at the same addresses.
#include <cstdint>
#include <vector>

namespace moonrun {

// A sequence with at most this many new tokens (a decode token, or a speculative verify of
// the last token and its drafts) takes the decode-path kernels, which read every
// per-sequence value from the batch's device tables (a captured graph replays them) and
// attend in absorbed order; longer chunks take the prefill path, one sequence at a time.
inline constexpr int kShortSeqMaxNewTokens = 16;

struct BatchSeq {
  int32_t token_start = 0;  // first row of this sequence's new tokens
  int32_t n_new = 0;        // new tokens this step (a prefill chunk, or 1 for decode)
  int32_t n_past = 0;       // tokens already in its caches
  int32_t state_slot = -1;  // its recurrent-state slot
  int32_t page_start = 0;   // its page table: page_table[page_start .. page_start + n_pages)
  int32_t n_pages = 0;      // covers n_past + n_new tokens
};

struct ForwardBatch {
  std::vector<int32_t> token_ids;  // [n_tokens]
  std::vector<int32_t> positions;  // [n_tokens] n_past + index within the sequence
  std::vector<int32_t> token_seq;  // [n_tokens] index into seqs
  std::vector<BatchSeq> seqs;
  std::vector<int32_t> page_table;  // the sequences' page tables, concatenated
  std::vector<int32_t> logit_rows;  // token rows whose logits the step returns, in order
  // Token rows whose input row is given rather than looked up in the embedding table (an
  // image's rows from the vision tower): row embed_rows[i] takes
  // embed_values[i * hidden, (i + 1) * hidden). The model uploads them (host only).
  std::vector<int32_t> embed_rows;
  std::vector<float> embed_values;
  // Speculative decoding: the token rows of the sequences this step verifies (drafts), whose
  // recurrent-state inputs the model saves so that a rejected draft's trace can be undone
  // (Model::replay_state). Saved row i is token row save_rows[i]. Host only.
  std::vector<int32_t> save_rows;
  // DP attention (runtime/model_runner.h, RunnerOptions::dp_attention_size): the new tokens of
  // every rank of the group this step, by rank (empty when off). This batch holds rank
  // dp_rank's sequences; the MoE layers gather every rank's rows in rank order around the
  // expert-parallel experts (model/layers/moe.h, moe_forward_dp). Host only.
  std::vector<int32_t> dp_tokens;
  int dp_rank = 0;

  int n_tokens() const { return static_cast<int>(token_ids.size()); }
  int n_seqs() const { return static_cast<int>(seqs.size()); }
  bool decode_only() const { return n_tokens() == n_seqs(); }
  // Appends one sequence; its logits row (the last new token, or all when all_logits) too.
  void add_seq(const int32_t* new_ids, int n_new, int n_past, int state_slot, const int32_t* pages, int n_pages,
               bool all_logits = false);
};

// The batch as the ops see it: the host tables, and the same tables in backend memory
// (equal to the host pointers on the CPU backend).
struct BatchView {
  const ForwardBatch* host = nullptr;
  const int32_t* token_ids = nullptr;   // [n_tokens]
  const int32_t* positions = nullptr;   // [n_tokens]
  const int32_t* token_seq = nullptr;   // [n_tokens]
  const BatchSeq* seqs = nullptr;       // [n_seqs]
  const int32_t* page_table = nullptr;
  const int32_t* logit_rows = nullptr;  // [n_logit_rows]
  int n_tokens() const { return host->n_tokens(); }
  int n_seqs() const { return host->n_seqs(); }
  int n_logit_rows() const { return static_cast<int>(host->logit_rows.size()); }
};

inline void ForwardBatch::add_seq(const int32_t* new_ids, int n_new, int n_past, int state_slot, const int32_t* pages,
                                  int n_pages, bool all_logits) {
  BatchSeq s;
  s.token_start = n_tokens();
  s.n_new = n_new;
  s.n_past = n_past;
  s.state_slot = state_slot;
  s.page_start = static_cast<int32_t>(page_table.size());
  s.n_pages = n_pages;
  const int32_t seq_index = n_seqs();
  for (int i = 0; i < n_new; ++i) {
    token_ids.push_back(new_ids[i]);
    positions.push_back(n_past + i);
    token_seq.push_back(seq_index);
    if (all_logits || i == n_new - 1) logit_rows.push_back(s.token_start + i);
  }
  page_table.insert(page_table.end(), pages, pages + n_pages);
  seqs.push_back(s);
}

}  // namespace moonrun
