#pragma once
// Rotary embedding rows for MLA's rope dims (Ops::rope_interleaved rotates by them): plain
// RoPE, and DeepSeek-V3's YaRN (transformers' _compute_yarn_parameters; DeepSeek's
// inference/model.py precompute_freqs_cis): frequencies blended between interpolated and
// extrapolated across the correction range, cos/sin scaled by mscale(factor, mscale) /
// mscale(factor, mscale_all_dim), and the softmax scale widened by mscale(factor,
// mscale_all_dim)^2. The K2 family's attention and the DSpark drafts use it.
#include <cstdint>
#include <span>
#include <vector>

#include "backend/ops.h"
#include "model/config.h"

namespace moonrun {

// DeepSeek's yarn_get_mscale: 0.1 * mscale * ln(factor) + 1 for factor > 1, else 1.
float yarn_mscale(float factor, float mscale);

class RopeTable {
 public:
  RopeTable() = default;
  RopeTable(int rope_dim, float theta, const RopeScaling& scaling);

  int rope_dim() const { return rope_dim_; }
  // [positions.size(), rope_dim] rows: cos of pair i at col i, sin at rope_dim/2 + i.
  void fill(std::span<const int32_t> positions, float* out) const;
  std::vector<float> rows(std::span<const int32_t> positions) const;
  // What the softmax scale (nope + rope)^-1/2 is multiplied by: mscale(factor,
  // mscale_all_dim)^2 under YaRN with mscale_all_dim set, else 1.
  float softmax_scale_factor() const { return softmax_factor_; }
  std::span<const double> inv_freq() const { return inv_freq_; }

 private:
  int rope_dim_ = 0;
  std::vector<double> inv_freq_;  // [rope_dim / 2]
  double cos_sin_scale_ = 1.0;
  float softmax_factor_ = 1.0f;
};

// The rows of positions 0 .. n_positions - 1 in backend memory ([n_positions, rope_dim] F32,
// computed on the host as fill() computes them and uploaded a slice at a time): a forward
// gathers its batch's rows by the positions on the device, so it uploads nothing of its own
// and a captured graph replays it at any position.
Tensor alloc_rope_rows(Ops& ops, const RopeTable& rope, int64_t n_positions, const char* what);

// Multiplies an F32 weight the queries are linear in (q_a_layernorm, or an F32 q_proj) by
// `factor`, once at load: how YaRN's softmax factor reaches an attention op whose scale is
// the plain (nope + rope)^-1/2.
void fold_softmax_factor(Ops& ops, const Tensor& weight, float factor);

}  // namespace moonrun
