#pragma once
// The Kimi K3 text model on the CPU (K3_SPEC.md §2, the reference's KimiLinearModel):
// embeddings -> per layer [AttnRes mix -> input_layernorm -> KDA or MLA -> prefix update ->
// AttnRes mix -> post_attention_layernorm -> dense MLP or MoE] -> output AttnRes mix ->
// norm -> lm_head. Also runs Kimi Linear (plain residuals, no latent MoE).
#include <memory>
#include <string>

#include "model/checkpoint.h"
#include "model/config.h"
#include "model/forward_batch.h"
#include "model/state_pool.h"
#include "model/weights.h"

namespace moonrun {

// The checks every backend runs on a batch before touching its caches: token ids inside the
// vocabulary, KDA slots inside [0, num_kda_slots), MLA pages covering n_past + n_new tokens
// inside [0, num_pages). Errors name the sequence and the value.
Status check_forward_batch(const ModelConfig& cfg, const ForwardBatch& batch, int num_kda_slots, int num_pages,
                           int page_size_tokens);

class KimiK3Model {
 public:
  // Opens the checkpoint (directory or HF repo id), parses config.json and loads every
  // text-model tensor into float32.
  static Result<std::unique_ptr<KimiK3Model>> load(const std::string& dir_or_repo,
                                                    const WeightLoadOptions& options = {});
  static Result<std::unique_ptr<KimiK3Model>> from_checkpoint(const Checkpoint& ckpt,
                                                              const WeightLoadOptions& options = {});

  // The host weights (the CUDA backend uploads them, then drops the model).
  const ModelWeights& weights() const { return w_; }

  const ModelConfig& config() const { return cfg_; }

  // Which evaluation order the attention layers use; kAuto is the reference's choice
  // (chunked KDA / plain MLA for several tokens, recurrent / absorbed for one). Tests pin
  // the others to check the orders against each other.
  void set_attention_modes(cpu::KdaMode kda, cpu::MlaMode mla) {
    kda_mode_ = kda;
    mla_mode_ = mla;
  }

  // Appends each sequence's new tokens to its caches and writes logits
  // [batch.n_logit_rows(), vocab] in sequence order (all new tokens of a sequence when
  // all_logits, else its last). Errors (bad ids, slots, pages) leave the caches untouched.
  Status forward(const ForwardBatch& batch, KdaSlotPool& kda_pool, const MlaPoolView& mla_pool,
                 float* logits) const;

 private:
  KimiK3Model() = default;
  Status check_batch(const ForwardBatch& batch, const KdaSlotPool& kda_pool, const MlaPoolView& mla_pool) const;
  // One sequence: new tokens [n_new] -> final hidden states [n_new, hidden] (before the norm).
  void forward_seq(const ForwardSeq& seq, KdaSlotPool& kda_pool, const MlaPoolView& mla_pool,
                   std::vector<float>& hidden) const;

  ModelConfig cfg_;
  ModelWeights w_;
  cpu::KdaMode kda_mode_ = cpu::KdaMode::kAuto;
  cpu::MlaMode mla_mode_ = cpu::MlaMode::kAuto;
};

}  // namespace moonrun
