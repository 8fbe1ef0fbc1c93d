#include "model/cuda/kimi_k3_cuda.h"

#include <algorithm>

#include "model/layer_dims.h"

namespace moonrun::cuda {

namespace {

const float* upload_f32(DeviceArena& arena, const std::vector<float>& v, const char* what) {
  return v.empty() ? nullptr : arena.upload(v, what);
}

}  // namespace

CudaKimiK3Model::CudaKimiK3Model(const KimiK3Model& host, DeviceArena& arena, cudaStream_t stream)
    : cfg_(host.config()), stream_(stream), blas_(std::make_unique<Blas>(stream)) {
  const size_t before = arena.used();
  const ModelWeights& hw = host.weights();
  w_.embed_tokens = arena.upload(to_bf16(hw.embed_tokens), "embed_tokens");
  w_.layers.resize(cfg_.num_hidden_layers);
  for (int i = 0; i < cfg_.num_hidden_layers; ++i) {
    const LayerWeights& hl = hw.layers[i];
    DeviceLayerWeights& dl = w_.layers[i];
    dl.input_layernorm = upload_f32(arena, hl.input_layernorm, "input_layernorm");
    dl.post_attention_layernorm = upload_f32(arena, hl.post_attention_layernorm, "post_attention_layernorm");
    dl.attn_res_norm = upload_f32(arena, hl.attn_res_norm, "attn_res_norm");
    dl.attn_res_proj = upload_f32(arena, hl.attn_res_proj, "attn_res_proj");
    dl.mlp_res_norm = upload_f32(arena, hl.mlp_res_norm, "mlp_res_norm");
    dl.mlp_res_proj = upload_f32(arena, hl.mlp_res_proj, "mlp_res_proj");
    const LayerSpec& spec = cfg_.layers[i];
    if (spec.attn == LayerKind::kda) dl.kda = upload_kda(arena, hl.kda);
    else dl.mla = upload_mla(arena, hl.mla);
    if (spec.mlp == MlpKind::dense) dl.mlp = upload_mlp(arena, hl.mlp);
    else dl.moe = upload_moe(arena, hl.moe);
  }
  w_.norm = upload_f32(arena, hw.norm, "norm");
  w_.output_attn_res_norm = upload_f32(arena, hw.output_attn_res_norm, "output_attn_res_norm");
  w_.output_attn_res_proj = upload_f32(arena, hw.output_attn_res_proj, "output_attn_res_proj");
  if (cfg_.tie_word_embeddings) w_.lm_head = DeviceLinear{w_.embed_tokens, cfg_.vocab_size, cfg_.hidden_size};
  else w_.lm_head = upload_linear(arena, hw.lm_head, "lm_head");
  weight_bytes_ = arena.used() - before;
}

int64_t CudaKimiK3Model::kda_slot_floats() const {
  return cfg_.num_kda_layers > 0 ? cfg_.num_kda_layers * kda_state_floats(kda_dims(cfg_)) : 0;
}

void CudaKimiK3Model::reset_kda_slot(const DeviceStatePools& pools, int slot) const {
  const int64_t n = kda_slot_floats();
  if (n == 0) return;
  CUDA_CHECK(cudaMemsetAsync(pools.kda + slot * n, 0, n * sizeof(float), stream_));
}

void CudaKimiK3Model::forward_seq(const ForwardSeq& seq, const DeviceStatePools& pools, Scratch& scratch,
                                  float* h) const {
  const int H = cfg_.hidden_size, T = static_cast<int>(seq.new_token_ids.size());
  const int B = cfg_.attn_res_block_size;
  const float eps = cfg_.rms_norm_eps;
  const int64_t n = static_cast<int64_t>(T) * H;
  const size_t bytes = n * sizeof(float);
  const cpu::KdaDims kdims = kda_dims(cfg_);
  const cpu::MlaDims mdims = mla_dims(cfg_);
  const cpu::MoeDims moedims = moe_dims(cfg_);
  const cpu::ActivationParams act = activation_params(cfg_);
  const int64_t kda_floats = kda_state_floats(kdims);

  // Inputs of this sequence: token ids and its MLA page table.
  int32_t* ids = scratch.take<int32_t>(T);
  CUDA_CHECK(cudaMemcpyAsync(ids, seq.new_token_ids.data(), T * sizeof(int32_t), cudaMemcpyHostToDevice, stream_));
  int32_t* pages = nullptr;
  if (!seq.pages.empty()) {
    pages = scratch.take<int32_t>(seq.pages.size());
    CUDA_CHECK(cudaMemcpyAsync(pages, seq.pages.data(), seq.pages.size() * sizeof(int32_t), cudaMemcpyHostToDevice,
                               stream_));
  }

  embed_tokens(w_.embed_tokens, H, ids, T, h, stream_);  // h: [T, hidden], the layer input, then its output

  // Completed AttnRes block summaries [T, hidden] each, and the device array of their pointers.
  const int max_blocks = B > 0 ? (cfg_.num_hidden_layers + B - 1) / B : 0;
  std::vector<const float*> block_ptrs;
  const float** d_block_ptrs = max_blocks ? scratch.take<const float*>(max_blocks) : nullptr;
  float* block_store = max_blocks ? scratch.take<float>(max_blocks * n) : nullptr;  // [max_blocks, T, hidden]
  float* x = scratch.take<float>(n);       // [T, hidden] sub-layer input (mix result)
  float* a = scratch.take<float>(n);       // [T, hidden] attention output
  float* prefix = scratch.take<float>(n);  // [T, hidden] running in-block sum
  float* m = scratch.take<float>(n);       // [T, hidden] MLP output
  float* xn = scratch.take<float>(n);      // [T, hidden] normed, fp32 (the router's input)
  bf16* xn_bf = scratch.take<bf16>(n);     // [T, hidden] normed, bf16 (the projections' input)

  for (int i = 0; i < cfg_.num_hidden_layers; ++i) {
    const LayerSpec& spec = cfg_.layers[i];
    const DeviceLayerWeights& lw = w_.layers[i];
    const bool block_start = B > 0 && i % B == 0;

    // 1. The attention input: a mix over depth (or the residual stream itself).
    const float* attn_in = h;
    if (B > 0 && !block_ptrs.empty()) {
      attn_res_mix(h, d_block_ptrs, static_cast<int>(block_ptrs.size()), T, H, lw.attn_res_norm, lw.attn_res_proj,
                   eps, x, stream_);
      attn_in = x;
    }
    if (block_start) {
      float* blk = block_store + block_ptrs.size() * n;
      CUDA_CHECK(cudaMemcpyAsync(blk, h, bytes, cudaMemcpyDeviceToDevice, stream_));
      block_ptrs.push_back(blk);
      // Pageable source: the copy is staged before cudaMemcpyAsync returns, so the host
      // vector may change afterwards.
      CUDA_CHECK(cudaMemcpyAsync(d_block_ptrs, block_ptrs.data(), block_ptrs.size() * sizeof(float*),
                                 cudaMemcpyHostToDevice, stream_));
    }
    Scratch attn_scratch(scratch.arena());  // this layer's attention / MLP temporaries

    // 2. Attention: KDA (linear) or MLA (full), through this sequence's caches.
    rmsnorm(attn_in, T, H, lw.input_layernorm, eps, xn_bf, stream_);
    if (spec.attn == LayerKind::kda) {
      float* st = pools.kda + (static_cast<int64_t>(seq.kda_slot) * cfg_.num_kda_layers + spec.kda_index) * kda_floats;
      kda_forward(*blas_, lw.kda, kdims, xn_bf, T, kda_state_at(st, kdims), a, attn_scratch, kda_mode_);
    } else {
      DeviceMlaCache cache;
      cache.page_size_tokens = pools.page_size_tokens;
      cache.num_pages = pools.num_pages;
      cache.layer_base = pools.mla + static_cast<int64_t>(spec.mla_index) * pools.num_pages *
                                         pools.page_size_tokens * cfg_.mla_cache_row();
      cache.pages = pages;
      mla_forward(*blas_, lw.mla, mdims, xn_bf, T, seq.n_past_tokens, cache, a, attn_scratch, mla_mode_);
    }

    // 3. The running sum: restarts at each block start under AttnRes (plain residual without).
    if (block_start) CUDA_CHECK(cudaMemcpyAsync(prefix, a, bytes, cudaMemcpyDeviceToDevice, stream_));
    else add(h, a, n, prefix, stream_);

    // 4. The MLP input: again a mix over depth under AttnRes.
    const float* mlp_in = prefix;
    if (B > 0) {
      attn_res_mix(prefix, d_block_ptrs, static_cast<int>(block_ptrs.size()), T, H, lw.mlp_res_norm,
                   lw.mlp_res_proj, eps, x, stream_);
      mlp_in = x;
    }

    // 5. MLP: dense (first_k_dense_replace) or MoE.
    rmsnorm(mlp_in, T, H, lw.post_attention_layernorm, eps, xn_bf, stream_);
    if (spec.mlp == MlpKind::dense) {
      mlp_forward(*blas_, lw.mlp, act, xn_bf, T, m, attn_scratch);
    } else {
      rmsnorm(mlp_in, T, H, lw.post_attention_layernorm, eps, xn, stream_);
      moe_forward(*blas_, lw.moe, moedims, xn, xn_bf, T, m, attn_scratch);
    }
    add(prefix, m, n, h, stream_);
  }
  if (B > 0) {
    attn_res_mix(h, d_block_ptrs, static_cast<int>(block_ptrs.size()), T, H, w_.output_attn_res_norm,
                 w_.output_attn_res_proj, eps, x, stream_);
    CUDA_CHECK(cudaMemcpyAsync(h, x, bytes, cudaMemcpyDeviceToDevice, stream_));
  }
}

Status CudaKimiK3Model::forward(const ForwardBatch& batch, const DeviceStatePools& pools, DeviceArena& arena,
                                float* logits) const {
  MR_RETURN_IF_ERROR(check_forward_batch(cfg_, batch, pools.num_kda_slots, pools.num_pages, pools.page_size_tokens));
  const int H = cfg_.hidden_size, V = cfg_.vocab_size;
  Scratch scratch(arena);
  float* d_logits = scratch.take<float>(static_cast<size_t>(batch.n_logit_rows()) * V);  // [rows, vocab]
  int64_t out_row = 0;
  for (const ForwardSeq& seq : batch.seqs) {
    Scratch seq_scratch(arena);
    const int T = static_cast<int>(seq.new_token_ids.size());
    float* h = seq_scratch.take<float>(static_cast<size_t>(T) * H);  // [T, hidden]
    forward_seq(seq, pools, seq_scratch, h);
    const int first = seq.all_logits ? 0 : T - 1, n_rows = T - first;
    bf16* rows = seq_scratch.take<bf16>(static_cast<size_t>(n_rows) * H);  // [n_rows, hidden] normed final states
    rmsnorm(h + static_cast<int64_t>(first) * H, n_rows, H, w_.norm, cfg_.rms_norm_eps, rows, stream_);
    blas_->linear(rows, n_rows, w_.lm_head, d_logits + out_row * V);
    out_row += n_rows;
  }
  CUDA_CHECK(cudaMemcpyAsync(logits, d_logits, static_cast<size_t>(out_row) * V * sizeof(float),
                             cudaMemcpyDeviceToHost, stream_));
  CUDA_CHECK(cudaStreamSynchronize(stream_));
  return Status::ok();
}

}  // namespace moonrun::cuda
