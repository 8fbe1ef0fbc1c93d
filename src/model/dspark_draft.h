#pragma once
// DSpark draft models (issue #37): the speculative drafts the Kimi K3 recipes publish
// (Inferact/Kimi-K3-DSpark and its kin), MLA-native. A small dense decoder that reads the
// target's own hidden states and proposes a block of tokens in one pass:
//   context row p  = RMSNorm(fc([tap_0(p) | ... | tap_n-1(p)]))   tap_j = output of target
//                    layer target_layer_ids[j] at position p (the value the target's
//                    forward holds after that layer)
//   block at anchor a (the token the target just sampled, at position a, not yet fed):
//                    rows [embed(x_a), embed(mask) x (B-1)] at positions a .. a+B-1
//   each layer       pre-norm MLA (DeepSeek layout, RoPE on the rope dims, interleaved)
//                    whose queries are the block rows and whose keys are the context rows
//                    at positions < a plus every row of the block (bidirectional), then a
//                    SwiGLU MLP; final RMSNorm; the TARGET's lm_head
//   slot k           logits_k = base_k + markov_w2 . markov_w1[prev_k], prev_0 = x_a,
//                    prev_k = the draft of slot k-1; it proposes the token at a+k+1
//   confidence_k     sigmoid(proj([normed h_k | markov_w1[prev_k]]))
// (DeepSpec/TorchSpec's convention: slot k predicts anchor+k+1; speculators-trained
// checkpoints, which shift by one, are refused like SGLang does.) The draft's context rows
// live in its own paged cache with the target's page geometry and page ids: every target
// step ingests the rows of the tokens it computed, so the prefix cache, preemption and
// rejected drafts need nothing of their own (a rejected token's row sits at a position the
// next anchor does not see, and is overwritten when that position is computed again).
// The config and tensors: docs/speculative.md, "DSpark drafts".
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/ops.h"
#include "common/status.h"
#include "model/config.h"
#include "model/layers/mla.h"
#include "model/layers/mlp.h"
#include "model/layers/rope.h"
#include "model/model.h"

namespace moonrun {

struct DSparkConfig {
  int hidden_size = 0;
  int num_layers = 0;
  int num_heads = 0;
  int q_lora_rank = 0;
  int kv_lora_rank = 0;
  int qk_nope_head_dim = 0;
  int qk_rope_head_dim = 0;
  int v_head_dim = 0;
  int intermediate_size = 0;
  float rms_norm_eps = 1e-6f;
  float rope_theta = 10000.0f;
  RopeScaling rope_scaling;
  int vocab_size = 0;
  int block_size = 0;  // rows a pass drafts (proposals: up to this many)
  int mask_token_id = -1;
  std::vector<int> target_layer_ids;  // 0-based target layers whose outputs are tapped
  int markov_rank = 0;
  bool confidence_head = true;
  bool confidence_with_markov = true;
  int n_taps() const { return static_cast<int>(target_layer_ids.size()); }
  int cache_row_width() const { return kv_lora_rank + qk_rope_head_dim; }
};

// The draft's config.json: the DSpark fields at the top level or in "dspark_config" (or
// SGLang's dspark_* prefixed keys), MLA widths, rope. A clear error for what moonrun cannot
// run (another Markov head type, GQA layouts, speculators' slot convention).
Result<DSparkConfig> parse_dspark_config(const nlohmann::json& config);
// The draft fits the target: hidden size, vocabulary, tapped layers in range, mask id.
Status check_dspark_fits(const DSparkConfig& draft, const ModelConfig& target);

// One sequence's block to draft: its page table (covering at least [0, anchor_pos)), the
// anchor token and position, and how many drafts it wants (<= block_size).
struct DraftBlockRequest {
  std::span<const int32_t> pages;
  int32_t anchor_token = 0;
  int32_t anchor_pos = 0;
  int n_draft = 0;
};

struct DraftBlockResult {
  std::vector<int32_t> tokens;    // n_draft greedy drafts
  std::vector<float> confidence;  // per draft, when the checkpoint has the head
  std::vector<float> logits;      // [n_draft, vocab] corrected logits, when asked
};

// The draft's page pool: kv_layers() regions of (num_pages + spare) pages each, the first
// num_pages indexed by the target's page ids, the spare ones lent to blocks that run past a
// sequence's allocated pages. Beside it, what lets ingest() and propose() run inside
// captured graphs with nothing uploaded from the host but the batch: the rope rows of every
// position (gathered by the batch's positions on the device) and the block-row index.
struct DraftPool {
  Tensor kv;  // [layers * rows_per_layer, cache_row_width]
  int num_pages = 0;        // the target's pages
  int spare_pages = 0;      // after them
  int page_size_tokens = 0;
  Tensor rope;      // [max_positions, qk_rope_head_dim] F32: RopeTable rows of positions 0..
  Tensor last_row;  // [max_seqs * block_size] I32: row t -> t / B * B + B - 1, its block's last
  int max_seqs = 0;
  int64_t rows_per_layer() const { return static_cast<int64_t>(num_pages + spare_pages) * page_size_tokens; }
};

// Graph keys of propose()'s captured passes carry this bit (ModelRunner's steps and
// rollbacks use bit 63 and the low bits).
inline constexpr uint64_t kDSparkGraphKey = uint64_t{1} << 62;
inline constexpr int kMaxCapturedDraftSeqs = 8;

class DSparkDraft {
 public:
  // Loads the checkpoint at `dir` (a directory or a hub repo id) onto the ops; checks that
  // it fits `target`.
  static Result<std::unique_ptr<DSparkDraft>> load(Ops& ops, const std::string& dir, const ModelConfig& target,
                                                    bool log_progress = false);
  const DSparkConfig& config() const { return cfg_; }
  const std::string& dir() const { return dir_; }
  size_t weight_bytes() const { return weight_bytes_; }

  // Spare pages a propose() of up to max_seqs sequences needs.
  int spare_pages_for(int max_seqs, int page_size_tokens) const;
  // The pool for blocks of up to max_seqs sequences at positions below max_positions (the
  // longest context plus a block); fixed_bytes: what it holds beside the paged rows.
  DraftPool allocate_pool(Ops& ops, int num_pages, int page_size_tokens, DType kv_dtype, int max_seqs,
                          int64_t max_positions) const;
  int64_t fixed_bytes(int max_seqs, int64_t max_positions) const;

  // The context rows of every token of a target step: taps [n_taps * taps_stride_rows,
  // hidden] F32, tap j of token t at row j * taps_stride_rows + t; written at the batch's
  // positions into the batch's pages.
  void ingest(Ops& ops, const BatchView& batch, const Tensor& taps, int64_t taps_stride_rows, const DraftPool& pool);

  // Drafts each request's block (greedy, Markov-corrected): one pass of the backbone for
  // all of them, then the Markov head slot by slot (Ops::dspark_markov). With `capture` (a
  // backend that captures) and at most kMaxCapturedDraftSeqs requests, the pass from the
  // embedding to the heads is one graph per (sequences padded to a power of two, slots)
  // shape: only the batch tables are uploaded, only tokens come back.
  // At most pool.max_seqs requests.
  void propose(Ops& ops, std::span<const DraftBlockRequest> requests, const DraftPool& pool,
               const DraftSharedWeights& shared, std::vector<DraftBlockResult>& results, bool want_logits = false,
               bool capture = false);

 private:
  DSparkDraft() = default;
  KvLayer layer_cache(const DraftPool& pool, int layer) const;

  struct Layer {
    Tensor input_layernorm, post_attention_layernorm;  // [1, hidden] F32
    MlaWeights attn;
    MlpWeights mlp;
  };
  DSparkConfig cfg_;
  std::string dir_;
  MlaDims mla_;
  RopeTable rope_;
  std::vector<Matrix> fc_;  // per tap: the [hidden, hidden] block of fc.weight's columns
  Tensor hidden_norm, norm;
  std::vector<Layer> layers_;
  Tensor markov_w1_, markov_w2_;  // [vocab, rank] F32 each (Ops::dspark_markov)
  Tensor confidence_w_;           // [1, hidden (+ rank)] F32; empty without the head
  float confidence_b_ = 0.0f;
  size_t weight_bytes_ = 0;
};

}  // namespace moonrun
