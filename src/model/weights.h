#pragma once
// The text model's weights in float32, loaded from a Checkpoint through the name table
// (weight_names.h). Every tensor is checked for dtype and shape on the way in; MXFP4
// experts are dequantised at load (the CPU backend is the reference, not the fast path).
#include <vector>

#include "kernels/cpu/kda.h"
#include "kernels/cpu/linear.h"
#include "kernels/cpu/mla.h"
#include "kernels/cpu/mlp.h"
#include "kernels/cpu/moe.h"
#include "model/checkpoint.h"
#include "model/config.h"

namespace moonrun {

struct LayerWeights {
  std::vector<float> input_layernorm;           // [hidden]
  std::vector<float> post_attention_layernorm;  // [hidden]
  // Attention Residuals (empty when attn_res_block_size is 0).
  std::vector<float> attn_res_norm, attn_res_proj;  // [hidden] each (proj stored [1, hidden])
  std::vector<float> mlp_res_norm, mlp_res_proj;    // [hidden] each
  cpu::KdaWeights kda;  // when the layer is KDA
  cpu::MlaWeights mla;  // when the layer is MLA
  cpu::MlpWeights mlp;  // dense layers
  cpu::MoeWeights moe;  // MoE layers
};

struct ModelWeights {
  std::vector<float> embed_tokens;  // [vocab, hidden]
  std::vector<LayerWeights> layers;
  std::vector<float> norm;                                       // [hidden]
  std::vector<float> output_attn_res_norm, output_attn_res_proj;  // [hidden] each
  cpu::Linear lm_head;  // [vocab, hidden]; a copy of embed_tokens when tied
};

struct WeightLoadOptions {
  // Keep MXFP4 experts packed (MoeWeights::packed_experts) instead of dequantising them:
  // the GPU backend's W4A16 kernels read the codes.
  bool mxfp4_packed = false;
};

// Loads and checks every text-model tensor; errors name the file, tensor and problem.
Result<ModelWeights> load_weights(const Checkpoint& ckpt, const ModelConfig& cfg,
                                  const WeightLoadOptions& options = {});

}  // namespace moonrun
