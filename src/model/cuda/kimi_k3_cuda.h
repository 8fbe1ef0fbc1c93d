#pragma once
// The Kimi K3 text model on one CUDA GPU: the same forward as model/kimi_k3.cpp (read that
// first; this file follows it step for step), with the CUDA twins of each op. Weights are
// bf16 on the device (MXFP4 experts stay packed for the W4A16 kernels; norms, conv
// weights, A_log, dt_bias, AttnRes vectors and the router stay fp32), the residual stream,
// the AttnRes blocks and the KDA state are fp32, projection inputs are bf16, the MLA latent
// cache is bf16.
#include <cstdint>
#include <memory>
#include <vector>

#include "kernels/cuda/common/device_buffer.h"
#include "kernels/cuda/dense/dense_ops.h"
#include "kernels/cuda/gemm/blas.h"
#include "kernels/cuda/kda/kda_layer.h"
#include "kernels/cuda/mla/mla_layer.h"
#include "kernels/cuda/moe/moe_layer.h"
#include "model/config.h"
#include "model/forward_batch.h"
#include "model/kimi_k3.h"

namespace moonrun::cuda {

struct DeviceLayerWeights {
  const float* input_layernorm = nullptr;           // [hidden]
  const float* post_attention_layernorm = nullptr;  // [hidden]
  const float* attn_res_norm = nullptr;             // [hidden] each (AttnRes only)
  const float* attn_res_proj = nullptr;
  const float* mlp_res_norm = nullptr;
  const float* mlp_res_proj = nullptr;
  DeviceKdaWeights kda;
  DeviceMlaWeights mla;
  DeviceMlpWeights mlp;
  DeviceMoeWeights moe;
};

struct DeviceModelWeights {
  const bf16* embed_tokens = nullptr;  // [vocab, hidden]
  std::vector<DeviceLayerWeights> layers;
  const float* norm = nullptr;          // [hidden]
  const float* output_attn_res_norm = nullptr;
  const float* output_attn_res_proj = nullptr;
  DeviceLinear lm_head;                 // [vocab, hidden] (the embedding table when tied)
};

// The device-side state pools, owned by the runner (carved from its arena).
struct DeviceStatePools {
  float* kda = nullptr;      // [num_kda_slots][num_kda_layers][kda_state_floats]
  int num_kda_slots = 0;
  bf16* mla = nullptr;       // [num_mla_layers][num_pages][page_size_tokens][cache_row]
  int num_pages = 0;
  int page_size_tokens = 0;
};

class CudaKimiK3Model {
 public:
  // Uploads host weights (loaded with WeightLoadOptions::mxfp4_packed) into `arena`.
  CudaKimiK3Model(const KimiK3Model& host, DeviceArena& arena, cudaStream_t stream);

  const ModelConfig& config() const { return cfg_; }
  size_t weight_bytes() const { return weight_bytes_; }
  void set_attention_modes(cpu::KdaMode kda, cpu::MlaMode mla) {
    kda_mode_ = kda;
    mla_mode_ = mla;
  }

  // Floats of KDA state one sequence needs over all KDA layers.
  int64_t kda_slot_floats() const;
  // Zeroes one slot's state (async on the model's stream).
  void reset_kda_slot(const DeviceStatePools& pools, int slot) const;

  // As KimiK3Model::forward: appends each sequence's new tokens to its caches and writes
  // logits [batch.n_logit_rows(), vocab] to HOST memory (synchronises the stream).
  // Temporaries come from `arena` above its current mark and are released on return.
  // Throws CudaError on a CUDA failure (the runner turns it into a Status).
  Status forward(const ForwardBatch& batch, const DeviceStatePools& pools, DeviceArena& arena,
                 float* logits) const;

 private:
  // One sequence: new tokens -> final hidden states [n_new, hidden] fp32 in `h`.
  void forward_seq(const ForwardSeq& seq, const DeviceStatePools& pools, Scratch& scratch, float* h) const;

  ModelConfig cfg_;
  DeviceModelWeights w_;
  cudaStream_t stream_;
  std::unique_ptr<Blas> blas_;
  size_t weight_bytes_ = 0;
  cpu::KdaMode kda_mode_ = cpu::KdaMode::kAuto;
  cpu::MlaMode mla_mode_ = cpu::MlaMode::kAuto;
};

}  // namespace moonrun::cuda
