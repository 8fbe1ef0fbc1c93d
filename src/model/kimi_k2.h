#pragma once
// The Kimi K2 generation (K2, K2-Thinking, K2.5 .. K2.7): the DeepSeek-V3 layout. Per layer
// input_layernorm -> MLA (q_a/q_b low rank, kv_a with the rope key, kv_b; rotary embeddings
// with YaRN scaling on the rope dims; no output gate) -> post_attention_layernorm -> dense MLP
// (layers < first_k_dense_replace) or MoE (sigmoid router with e_score_correction_bias,
// grouped top-k, routed experts INT4 pack-quantized, shared experts bf16). Plain residual
// stream, SwiGLU. Names as transformers' models/deepseek_v3 and vLLM's deepseek_v2.py load
// them; K2.5 and later put them under "language_model.".
//
// The forward runs on the CPU and CUDA backends with bf16 or INT4 experts. K2.5 and later
// (kimi_k25) carry K3's MoonViT tower in its K2.5 options (model/vision/moonvit.h): its rows
// replace the prompt's media placeholders as in K3.

#include <vector>

#include "backend/tensor.h"
#include "model/kimi_k3.h"  // TensorParallel
#include "model/layers/mla.h"
#include "model/layers/mlp.h"
#include "model/layers/moe.h"
#include "model/layers/rope.h"
#include "model/model.h"
#include "model/vision/moonvit.h"
#include "model/weight_spec.h"

namespace moonrun {

struct KimiK2LayerWeights {
  Tensor input_layernorm;           // [1, hidden] F32
  Tensor post_attention_layernorm;  // [1, hidden] F32
  MlaWeights mla;
  MlpWeights mlp;  // dense layers
  MoeWeights moe;  // MoE layers
};

struct KimiK2Weights {
  Matrix embed_tokens;  // [vocab, hidden]
  std::vector<KimiK2LayerWeights> layers;
  Tensor norm;      // [1, hidden] F32
  Matrix lm_head;   // [vocab, hidden]
  MoonVitWeights vision;  // kimi_k25 with a vision tower (config.vision.enabled)
};

// The one listing of the K2 text model's tensors (names, stored shapes and dtypes, shard
// rules), filling `w` through `sink`. The shard rules are K3's for the same roles: q_a,
// kv_a and the router replicated; q_b, kv_b, gate/up column; o_proj, down row; routed
// experts whole per expert group; embeddings and lm_head by vocabulary rows.
// A pipeline stage lists only its layers (embedding first, norm and lm_head last).
void describe_kimi_k2_weights(const ModelConfig& cfg, KimiK2Weights& w, WeightSink& sink,
                              const WeightLayout& layout = {});

// embeddings -> per layer [input_layernorm -> MLA (RoPE on q_pe and k_pe, YaRN) -> residual
// -> post_attention_layernorm -> dense MLP or MoE -> residual] -> norm -> lm_head.
class KimiK2 final : public Model {
 public:
  // YaRN's softmax factor is folded into the weights here (see the .cpp), so construct
  // once per loaded set of weights.
  // max_positions: the longest context served (0: the config's max_position_embeddings),
  // the rows of the rope table.
  // stage: the layers this rank runs (pipeline parallelism; all of them by default).
  KimiK2(Ops& ops, const ModelConfig& cfg, KimiK2Weights weights, size_t weight_bytes, TensorParallel tp = {},
         int64_t max_positions = 0, StageLayers stage = {});

  const ModelConfig& config() const override { return cfg_; }
  CacheSpec cache_spec() const override { return cache_spec_of_layers(stage_.first_layer, stage_.end_layer); }
  CacheSpec cache_spec_of_layers(int first_layer, int end_layer) const override;
  void forward(Ops& ops, const BatchView& batch, const CachePools& pools, Tensor logits) override;
  int pipeline_stages() const override { return stage_.num_stages; }
  void forward_body(Ops& ops, const BatchView& batch, const CachePools& pools, Tensor rows) override;
  void forward_head(Ops& ops, Tensor rows, Tensor logits) override;
  size_t weight_bytes() const override { return weight_bytes_; }
  int64_t max_positions() const override { return rope_rows_.rows; }
  int64_t scratch_bytes(int tokens_per_step) const override;
  bool has_vision() const override { return stage_.first() && vision_.enabled(); }
  std::vector<float> encode_images(Ops& ops, std::span<const vision::ImagePatches* const> images) override {
    return vision_.encode(ops, images);
  }

  // Which MLA evaluation order to use (tests pin both against each other).
  void set_attention_mode(MlaMode mla) { mla_mode_ = mla; }

 private:
  ModelConfig cfg_;
  KimiK2Weights w_;
  size_t weight_bytes_ = 0;
  TensorParallel tp_;
  StageLayers stage_;  // this rank's layers
  int mla_base_ = 0;   // the MLA cache index of its first layer
  int64_t vocab_begin_ = 0;
  MlaDims mla_dims_;  // this rank's heads
  MoeDims moe_dims_;
  ActivationParams act_;
  RopeTable rope_;
  Tensor rope_rows_;  // [max positions, qk_rope_head_dim] F32 (alloc_rope_rows)
  MlaMode mla_mode_ = MlaMode::kAuto;
  MoonVit vision_;
};

}  // namespace moonrun
