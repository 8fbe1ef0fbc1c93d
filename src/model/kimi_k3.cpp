#include "model/kimi_k3.h"

#include <algorithm>

#include "kernels/cpu/attn_res.h"
#include "kernels/cpu/embedding.h"
#include "kernels/cpu/linear.h"
#include "model/layer_dims.h"

namespace moonrun {

Result<std::unique_ptr<KimiK3Model>> KimiK3Model::load(const std::string& dir_or_repo,
                                                       const WeightLoadOptions& options) {
  auto ckpt = MR_TRY(Checkpoint::open(dir_or_repo));
  return from_checkpoint(*ckpt, options);
}

Result<std::unique_ptr<KimiK3Model>> KimiK3Model::from_checkpoint(const Checkpoint& ckpt,
                                                                 const WeightLoadOptions& options) {
  std::unique_ptr<KimiK3Model> m(new KimiK3Model());
  m->cfg_ = MR_TRY(parse_model_config(ckpt.config(), ckpt.dir() + "/config.json"));
  m->w_ = MR_TRY(load_weights(ckpt, m->cfg_, options));
  return m;
}

Status KimiK3Model::check_batch(const ForwardBatch& batch, const KdaSlotPool& kda_pool,
                                const MlaPoolView& mla_pool) const {
  if (cfg_.num_mla_layers > 0 && (mla_pool.base == nullptr || mla_pool.row_floats != cfg_.mla_cache_row() ||
                                  mla_pool.num_mla_layers != cfg_.num_mla_layers))
    return invalid_argument("the MLA pool does not match the model (row " + std::to_string(mla_pool.row_floats) +
                            " floats, want " + std::to_string(cfg_.mla_cache_row()) + ")");
  return check_forward_batch(cfg_, batch, kda_pool.num_slots(), mla_pool.num_pages, mla_pool.page_size_tokens);
}

Status check_forward_batch(const ModelConfig& cfg_, const ForwardBatch& batch, int num_kda_slots, int num_pages,
                           int page_size_tokens) {
  for (size_t s = 0; s < batch.seqs.size(); ++s) {
    const ForwardSeq& seq = batch.seqs[s];
    const std::string where = "sequence " + std::to_string(s) + ": ";
    if (seq.new_token_ids.empty()) return invalid_argument(where + "no new tokens");
    for (int32_t id : seq.new_token_ids)
      if (id < 0 || id >= cfg_.vocab_size)
        return invalid_argument(where + "token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                                std::to_string(cfg_.vocab_size) + ")");
    if (cfg_.num_kda_layers > 0 && (seq.kda_slot < 0 || seq.kda_slot >= num_kda_slots))
      return invalid_argument(where + "KDA slot " + std::to_string(seq.kda_slot) + " is not in [0, " +
                              std::to_string(num_kda_slots) + ")");
    if (cfg_.num_mla_layers > 0) {
      const int64_t n_total = seq.n_past_tokens + static_cast<int64_t>(seq.new_token_ids.size());
      const int64_t pages_needed = (n_total + page_size_tokens - 1) / page_size_tokens;
      if (static_cast<int64_t>(seq.pages.size()) < pages_needed)
        return invalid_argument(where + std::to_string(seq.pages.size()) + " MLA pages cover fewer than " +
                                std::to_string(n_total) + " tokens");
      for (int64_t p = 0; p < pages_needed; ++p)
        if (seq.pages[p] < 0 || seq.pages[p] >= num_pages)
          return invalid_argument(where + "MLA page " + std::to_string(seq.pages[p]) + " is not in the pool");
    }
  }
  return Status::ok();
}

void KimiK3Model::forward_seq(const ForwardSeq& seq, KdaSlotPool& kda_pool, const MlaPoolView& mla_pool,
                              std::vector<float>& h) const {
  const int H = cfg_.hidden_size, T = static_cast<int>(seq.new_token_ids.size());
  const int B = cfg_.attn_res_block_size;
  const float eps = cfg_.rms_norm_eps;
  const size_t n = static_cast<size_t>(T) * H;
  const cpu::KdaDims kdims = kda_dims(cfg_);
  const cpu::MlaDims mdims = mla_dims(cfg_);
  const cpu::MoeDims moedims = moe_dims(cfg_);
  const cpu::ActivationParams act = activation_params(cfg_);

  // MLA cache rows of this sequence in one layer, positions [0, n_past + T).
  const int n_total = seq.n_past_tokens + T;
  std::vector<float*> rows(n_total);
  auto mla_rows = [&](int mla_layer) {
    for (int p = 0; p < n_total; ++p)
      rows[p] = mla_pool.row(mla_layer, seq.pages[p / mla_pool.page_size_tokens], p % mla_pool.page_size_tokens);
    return rows.data();
  };

  h.resize(n);  // [T, hidden] the layer input, then its output ("prefix + m")
  cpu::embed_tokens(w_.embed_tokens.data(), H, seq.new_token_ids.data(), T, h.data());

  std::vector<std::vector<float>> blocks;  // completed AttnRes block summaries, [T, hidden] each
  std::vector<const float*> block_ptrs;
  std::vector<float> x(n), xn(n), a(n), prefix(n), m(n);  // [T, hidden] each
  for (int i = 0; i < cfg_.num_hidden_layers; ++i) {
    const LayerSpec& spec = cfg_.layers[i];
    const LayerWeights& lw = w_.layers[i];
    const bool block_start = B > 0 && i % B == 0;

    // 1. The attention input: a mix over depth (or the residual stream itself).
    if (B > 0 && !blocks.empty()) {
      cpu::attn_res_mix(h.data(), block_ptrs.data(), static_cast<int>(blocks.size()), T, H,
                        lw.attn_res_norm.data(), lw.attn_res_proj.data(), eps, x.data());
    } else {
      x = h;
    }
    if (block_start) {
      blocks.push_back(h);
      block_ptrs.clear();
      for (const auto& b : blocks) block_ptrs.push_back(b.data());
    }

    // 2. Attention: KDA (linear) or MLA (full), through this sequence's caches.
    cpu::rmsnorm(x.data(), T, H, lw.input_layernorm.data(), eps, xn.data());
    if (spec.attn == LayerKind::kda) {
      cpu::kda_forward(lw.kda, kdims, xn.data(), T, kda_pool.at(seq.kda_slot, spec.kda_index), a.data(),
                       kda_mode_);
    } else {
      cpu::mla_forward(lw.mla, mdims, xn.data(), T, seq.n_past_tokens, mla_rows(spec.mla_index), a.data(),
                       mla_mode_);
    }

    // 3. The running sum: restarts at each block start under AttnRes.
    // (Without AttnRes, B == 0: never a block start, and this is the plain residual h + a.)
    for (size_t j = 0; j < n; ++j) prefix[j] = block_start ? a[j] : h[j] + a[j];

    // 4. The MLP input: again a mix over depth under AttnRes.
    if (B > 0) {
      cpu::attn_res_mix(prefix.data(), block_ptrs.data(), static_cast<int>(blocks.size()), T, H,
                        lw.mlp_res_norm.data(), lw.mlp_res_proj.data(), eps, x.data());
    } else {
      x = prefix;
    }

    // 5. MLP: dense (first_k_dense_replace) or MoE.
    cpu::rmsnorm(x.data(), T, H, lw.post_attention_layernorm.data(), eps, xn.data());
    if (spec.mlp == MlpKind::dense) cpu::mlp_forward(lw.mlp, act, xn.data(), T, m.data());
    else cpu::moe_forward(lw.moe, moedims, xn.data(), T, m.data());
    for (size_t j = 0; j < n; ++j) h[j] = prefix[j] + m[j];
  }
  if (B > 0) {
    cpu::attn_res_mix(h.data(), block_ptrs.data(), static_cast<int>(blocks.size()), T, H,
                      w_.output_attn_res_norm.data(), w_.output_attn_res_proj.data(), eps, x.data());
    h = x;
  }
}

Status KimiK3Model::forward(const ForwardBatch& batch, KdaSlotPool& kda_pool, const MlaPoolView& mla_pool,
                            float* logits) const {
  MR_RETURN_IF_ERROR(check_batch(batch, kda_pool, mla_pool));
  const int H = cfg_.hidden_size, V = cfg_.vocab_size;
  std::vector<float> h, rows_out;
  int64_t out_row = 0;
  for (const ForwardSeq& seq : batch.seqs) {
    forward_seq(seq, kda_pool, mla_pool, h);
    const int T = static_cast<int>(seq.new_token_ids.size());
    const int first = seq.all_logits ? 0 : T - 1, n_rows = T - first;
    rows_out.resize(static_cast<size_t>(n_rows) * H);  // [n_rows, hidden] normed final states
    cpu::rmsnorm(h.data() + static_cast<size_t>(first) * H, n_rows, H, w_.norm.data(), cfg_.rms_norm_eps,
                 rows_out.data());
    cpu::apply(w_.lm_head, rows_out.data(), n_rows, logits + out_row * V);
    out_row += n_rows;
  }
  return Status::ok();
}

}  // namespace moonrun
