#pragma once
// The Kimi K3 text model (K3_SPEC.md §2, the reference's KimiLinearModel), written once
// against the ops: embeddings -> per layer [AttnRes mix -> input_layernorm -> KDA or MLA ->
// prefix update -> AttnRes mix -> post_attention_layernorm -> dense MLP or MoE] -> output
// AttnRes mix -> norm -> lm_head. Also runs Kimi Linear (plain residuals, no latent MoE), and
// Kimi K3.1 (model/kimi_k31.h): given the indexers, its full-attention layers are DSA layers
// (model/layers/dsa.h), everything else K3's.
#include <memory>
#include <vector>

#include "model/layers/dsa.h"
#include "model/layers/kda.h"
#include "model/layers/mla.h"
#include "model/layers/mlp.h"
#include "model/layers/moe.h"
#include "model/model.h"
#include "model/pipeline.h"
#include "model/vision/moonvit.h"
#include "model/weight_spec.h"

namespace moonrun {

struct KimiK3LayerWeights {
  Tensor input_layernorm;           // [1, hidden] F32
  Tensor post_attention_layernorm;  // [1, hidden]
  // Attention Residuals (empty when attn_res_block_size is 0).
  Tensor attn_res_norm, attn_res_proj;  // [1, hidden] each
  Tensor mlp_res_norm, mlp_res_proj;    // [1, hidden] each
  KdaWeights kda;  // when the layer is KDA
  MlaWeights mla;  // when the layer is MLA
  MlpWeights mlp;  // dense layers
  MoeWeights moe;  // MoE layers
};

struct KimiK3Weights {
  Matrix embed_tokens;  // [vocab, hidden]
  std::vector<KimiK3LayerWeights> layers;
  Tensor norm;                                        // [1, hidden] F32
  Tensor output_attn_res_norm, output_attn_res_proj;  // [1, hidden] F32 each
  Matrix lm_head;  // [vocab, hidden]; embed_tokens when tied
  MoonVitWeights vision;  // kimi_k3 with a vision tower (config.vision.enabled)
};

// The one listing of the model's tensors (names, stored shapes, shard rules), filling `w`
// through `sink`: the loader and weight_spec() both run it. A pipeline stage lists only its
// layers (and the embedding on the first stage, norm and lm_head on the last).
void describe_kimi_k3_weights(const ModelConfig& cfg, KimiK3Weights& w, WeightSink& sink,
                              const WeightLayout& layout = {});

// This rank's place in the tensor-parallel group: attention heads, MLP intermediate and
// vocabulary rows [rank * n / size, (rank + 1) * n / size) are its own; the layers'
// outputs are summed over the group (Ops::all_reduce_sum), the logits gathered.
struct TensorParallel {
  int rank = 0;
  int size = 1;
  bool split_router = false;      // WeightLayout: the router's rows are this rank's experts'
  bool split_latent_moe = false;  // WeightLayout: LatentMoE down column-split
  bool split_latent_up = false;   // and its up projection row-split
  // DP attention: size is 1 (every rank whole but the routed experts) while the group has
  // more ranks; the forward runs its own sequences and meets the others at each MoE layer
  // (moe_forward_dp), and skips the dense collectives.
  bool dp_attention = false;
};

// The ring (model/pipeline.h) at the end of a stage's forward: the last stage sends the
// rows that get logits [rows, hidden] back to stage 0, which receives them and goes on to
// norm and lm_head. False: this stage is done (it writes no logits).
// DP attention, no sequence of this rank in the step (TensorParallel::dp_attention): its part
// in every MoE layer's gather and expert sum all the same (moe_forward_dp), nothing else.
// layers[i].moe: the stage's MoE weights of layer i (K3's and K2's layer structs alike).
template <typename Layers>
void dp_attention_idle_step(Ops& ops, const ModelConfig& cfg, const StageLayers& stage, const Layers& layers,
                            const MoeDims& dims, const ForwardBatch& host) {
  const Tensor none = ops.scratch(0, cfg.hidden_size, DType::F32);
  for (int i = stage.first_layer; i < stage.end_layer; ++i)
    if (cfg.layers[i].mlp == MlpKind::moe)
      moe_forward_dp(ops, layers[i].moe, dims, none, none, host.dp_tokens, host.dp_rank, none);
}

// Rows whose input is given (the vision tower's rows at an image's placeholders: the K3
// reference's _merge_input_ids_with_image_features, transformers' kimi_k25 masked_scatter)
// replace their embedding lookups in h [T, hidden].
inline void put_given_rows(Ops& ops, const ForwardBatch& host, Tensor h) {
  if (host.embed_rows.empty()) return;
  const int64_t n = static_cast<int64_t>(host.embed_rows.size()), H = h.cols;
  MR_CHECK(host.embed_values.size() == static_cast<size_t>(n * H)) << "embed_values: " << n << " rows of " << H;
  Tensor given = ops.scratch(n, H, DType::F32);  // [n, hidden]
  ops.upload(given, 0, host.embed_values.data(), host.embed_values.size() * sizeof(float));
  for (int64_t i = 0; i < n; ++i) ops.copy(given.rows_view(i, 1), h.rows_view(host.embed_rows[i], 1));
}

inline bool logit_rows_round_the_ring(Ops& ops, const StageLayers& stage, Tensor rows) {
  if (stage.num_stages == 1) return true;
  if (stage.last()) {
    ops.pipe_send(rows);
    return false;
  }
  if (!stage.first()) return false;
  ops.pipe_recv(rows);
  return true;
}

class KimiK3 final : public Model {
 public:
  // indexers: K3.1's, one per DSA layer (LayerSpec::dsa_index); empty for K3 and Kimi Linear.
  // stage: the layers this rank runs (pipeline parallelism; all of them by default).
  KimiK3(const ModelConfig& cfg, KimiK3Weights weights, size_t weight_bytes, TensorParallel tp = {},
         std::vector<DsaIndexerWeights> indexers = {}, StageLayers stage = {});

  const ModelConfig& config() const override { return cfg_; }
  CacheSpec cache_spec() const override { return cache_spec_of_layers(stage_.first_layer, stage_.end_layer); }
  CacheSpec cache_spec_of_layers(int first_layer, int end_layer) const override;
  void forward(Ops& ops, const BatchView& batch, const CachePools& pools, Tensor logits) override;
  int pipeline_stages() const override { return stage_.num_stages; }
  void forward_body(Ops& ops, const BatchView& batch, const CachePools& pools, Tensor rows) override;
  void forward_head(Ops& ops, Tensor rows, Tensor logits) override;
  uint32_t graph_variant(const ForwardBatch& batch) const override;
  int64_t replay_floats_per_token() const override;
  bool set_taps(std::vector<int> layers) override;
  DraftSharedWeights draft_shared() const override;
  void replay_state(Ops& ops, const BatchView& batch, const CachePools& pools) override;
  size_t weight_bytes() const override { return weight_bytes_; }
  bool has_vision() const override { return stage_.first() && vision_.enabled(); }
  std::vector<float> encode_images(Ops& ops, std::span<const vision::ImagePatches* const> images) override {
    return vision_.encode(ops, images);
  }
  int64_t scratch_bytes(int tokens_per_step) const override;

  // Which evaluation order the attention layers use; kAuto is the reference's choice
  // (chunked KDA / plain MLA for several tokens, recurrent / absorbed for one). Tests pin
  // the others to check the orders against each other.
  void set_attention_modes(KdaMode kda, MlaMode mla) {
    kda_mode_ = kda;
    mla_mode_ = mla;
  }
  // K3.1: the indexer-key cache's row format (LoadOptions::index_cache_dtype), before the
  // runner sizes its pools from cache_spec().
  void set_index_cache_dtype(DType dtype) { index_dtype_ = dtype; }

 private:
  ModelConfig cfg_;
  KimiK3Weights w_;
  size_t weight_bytes_ = 0;
  TensorParallel tp_;
  // Pipeline parallelism: this rank's layers, and the cache indices its first layer's kinds
  // start at (a stage's pools hold its own layers only, from index 0).
  StageLayers stage_;
  int kda_base_ = 0, mla_base_ = 0, dsa_base_ = 0;
  int64_t vocab_begin_ = 0;
  // DSpark taps (set_taps): tap_of_layer_[i] = j when layer i's output goes to tap j, else -1.
  std::vector<int> tap_of_layer_;
  KdaShape kda_shape_;  // this rank's heads
  MlaDims mla_dims_;    // this rank's heads
  std::vector<DsaIndexerWeights> indexers_;  // K3.1's DSA layers (replicated: kimi_k31.h)
  DsaDims dsa_dims_;
  MoeDims moe_dims_;
  ActivationParams act_;
  KdaMode kda_mode_ = KdaMode::kAuto;
  MlaMode mla_mode_ = MlaMode::kAuto;
  DType index_dtype_ = DType::F32;
  MoonVit vision_;
};

}  // namespace moonrun
