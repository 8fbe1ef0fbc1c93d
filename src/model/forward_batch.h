#pragma once
// What one engine step asks of the model: for each scheduled sequence, the new tokens to
// append (a prefill chunk or one decode token), where its cache lives, and which logits to
// return. Built once per step by the runtime and passed explicitly to every layer (no
// global context). Header-only: the contract between engine/, cache/, runtime/ and model/.
#include <cstdint>
#include <vector>

namespace moonrun {

// The paged MLA latent pool: one row of `row_floats` (kv_lora + rope = 576 at K3 size) per
// token per MLA layer. Memory layout [num_mla_layers][num_pages][page_size_tokens][row].
struct MlaPoolView {
  float* base = nullptr;
  int num_mla_layers = 0;
  int num_pages = 0;
  int page_size_tokens = 0;
  int row_floats = 0;
  float* row(int mla_layer, int page, int offset) const {
    return base + ((static_cast<int64_t>(mla_layer) * num_pages + page) * page_size_tokens + offset) *
                      static_cast<int64_t>(row_floats);
  }
};

struct ForwardSeq {
  int kda_slot = -1;                  // index of this sequence's KDA state slot
  int n_past_tokens = 0;              // tokens already in the caches
  std::vector<int32_t> new_token_ids; // [n_new] appended this step
  std::vector<int32_t> pages;         // MLA pages covering [0, n_past + n_new)
  bool all_logits = false;            // logits for every new token (else only the last)
};

struct ForwardBatch {
  std::vector<ForwardSeq> seqs;
  int n_logit_rows() const {
    int n = 0;
    for (const auto& s : seqs) n += s.all_logits ? static_cast<int>(s.new_token_ids.size()) : 1;
    return n;
  }
};

}  // namespace moonrun
