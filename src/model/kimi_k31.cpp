#include "model/kimi_k31.h"

namespace moonrun {

void describe_kimi_k31_weights(const ModelConfig& cfg, KimiK31Weights& w, WeightSink& sink,
                               const WeightLayout& layout) {
  describe_kimi_k3_weights(cfg, w.k3, sink, layout);
  const StageLayers& stage = layout.stage;
  const TensorNames names(cfg);
  const DsaPart& d = cfg.dsa;
  const int H = cfg.hidden_size;
  w.indexers.resize(static_cast<size_t>(cfg.num_dsa_layers));
  for (int i = 0; i < cfg.num_hidden_layers; ++i) {
    const int k = cfg.layers[i].dsa_index;
    if (k < 0 || !stage.has(i)) continue;
    DsaIndexerWeights& iw = w.indexers[static_cast<size_t>(k)];
    auto n = [&](const std::string& s) { return names.layer(i, "self_attn.indexer." + s); };
    // Replicated, all of it (kimi_k31.h says why).
    sink.matrix(iw.wq_b, n("wq_b.weight"), d.index_n_heads * d.index_head_dim, cfg.q_lora_rank,
                ShardRule::replicated);
    sink.matrix(iw.wk, n("wk.weight"), d.index_head_dim, H, ShardRule::replicated);
    sink.f32(iw.k_norm, n("k_norm.weight"), DType::BF16, {d.index_head_dim}, 1, d.index_head_dim,
             ShardRule::replicated);
    sink.f32(iw.k_norm_bias, n("k_norm.bias"), DType::BF16, {d.index_head_dim}, 1, d.index_head_dim,
             ShardRule::replicated);
    sink.matrix(iw.weights_proj, n("weights_proj.weight"), d.index_n_heads, H, ShardRule::replicated);
  }
}

}  // namespace moonrun
