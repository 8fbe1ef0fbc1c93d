#pragma once
// Attention Residuals (K3_SPEC.md §2): instead of a plain residual sum, each sub-layer reads
// a softmax mix over depth of the completed block summaries and the running in-block prefix.
// Per token, nothing crosses time.
namespace moonrun::cpu {

// out[t] = sum_i softmax_i(score) * V_i[t] over V = [blocks[0..n_blocks), prefix], where
// score_i = sum_c rmsnorm_nw(V_i[t])[c] * w_norm[c] * w_proj[c] (norm without weight, eps),
// in float32. prefix, blocks[i], out: [n_tokens, hidden]; out may alias prefix.
void attn_res_mix(const float* prefix, const float* const* blocks, int n_blocks, int n_tokens,
                  int hidden, const float* w_norm, const float* w_proj, float eps, float* out);

}  // namespace moonrun::cpu
