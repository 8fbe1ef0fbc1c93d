#include "model/layers/rope.h"

#include <algorithm>
#include <cmath>

#include "common/check.h"

namespace moonrun {

float yarn_mscale(float factor, float mscale) {
  return factor <= 1.0f ? 1.0f : 0.1f * mscale * std::log(factor) + 1.0f;
}

namespace {

constexpr double kPi = 3.14159265358979323846;

// The dimension index at which a frequency turns num_rotations times over max_positions.
double correction_dim(double num_rotations, int dim, double base, int max_positions) {
  return dim * std::log(max_positions / (num_rotations * 2 * kPi)) / (2 * std::log(base));
}

}  // namespace

RopeTable::RopeTable(int rope_dim, float theta, const RopeScaling& s) : rope_dim_(rope_dim) {
  MR_CHECK(rope_dim > 0 && rope_dim % 2 == 0) << "rope dims must be even, got " << rope_dim;
  const int half = rope_dim / 2;
  inv_freq_.resize(half);
  for (int i = 0; i < half; ++i) inv_freq_[i] = 1.0 / std::pow(static_cast<double>(theta), 2.0 * i / rope_dim);
  if (!s.yarn || s.factor <= 1.0f) return;
  MR_CHECK(s.original_max_position_embeddings > 0) << "YaRN needs original_max_position_embeddings";
  // Below `low` the frequencies extrapolate (kept), above `high` they interpolate (/ factor),
  // a linear ramp between (transformers' truncate=True: floor / ceil).
  double low = std::floor(correction_dim(s.beta_fast, rope_dim, theta, s.original_max_position_embeddings));
  double high = std::ceil(correction_dim(s.beta_slow, rope_dim, theta, s.original_max_position_embeddings));
  low = std::max(low, 0.0);
  high = std::min(high, static_cast<double>(rope_dim - 1));
  if (low == high) high += 0.001;
  for (int i = 0; i < half; ++i) {
    const double ramp = std::clamp((i - low) / (high - low), 0.0, 1.0);
    const double extrapolation = 1.0 - ramp;
    inv_freq_[i] = inv_freq_[i] / s.factor * (1.0 - extrapolation) + inv_freq_[i] * extrapolation;
  }
  const double all_dim = s.mscale_all_dim != 0.0f ? yarn_mscale(s.factor, s.mscale_all_dim) : 1.0;
  cos_sin_scale_ = yarn_mscale(s.factor, s.mscale) / all_dim;
  if (s.mscale_all_dim != 0.0f) softmax_factor_ = static_cast<float>(all_dim * all_dim);
}

void RopeTable::fill(std::span<const int32_t> positions, float* out) const {
  const int half = rope_dim_ / 2;
  for (size_t t = 0; t < positions.size(); ++t) {
    float* row = out + t * rope_dim_;
    for (int i = 0; i < half; ++i) {
      const double angle = positions[t] * inv_freq_[i];
      row[i] = static_cast<float>(std::cos(angle) * cos_sin_scale_);
      row[half + i] = static_cast<float>(std::sin(angle) * cos_sin_scale_);
    }
  }
}

Tensor alloc_rope_rows(Ops& ops, const RopeTable& rope, int64_t n_positions, const char* what) {
  const int R = rope.rope_dim();
  Tensor table = ops.alloc(n_positions, R, DType::F32, what);
  constexpr int64_t kSlice = 65536;
  std::vector<int32_t> positions;
  std::vector<float> rows;
  for (int64_t p0 = 0; p0 < n_positions; p0 += kSlice) {
    const int64_t n = std::min(kSlice, n_positions - p0);
    positions.resize(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) positions[i] = static_cast<int32_t>(p0 + i);
    rows.resize(static_cast<size_t>(n) * R);
    rope.fill(positions, rows.data());
    ops.upload(table, static_cast<size_t>(p0) * R * sizeof(float), rows.data(), rows.size() * sizeof(float));
  }
  return table;
}

void fold_softmax_factor(Ops& ops, const Tensor& weight, float factor) {
  MR_CHECK(weight.dtype == DType::F32) << "fold_softmax_factor needs an F32 weight";
  std::vector<float> host(static_cast<size_t>(weight.numel()));
  ops.download(weight, host.data());
  for (float& x : host) x *= factor;
  ops.upload(weight, 0, host.data(), host.size() * sizeof(float));
}

std::vector<float> RopeTable::rows(std::span<const int32_t> positions) const {
  std::vector<float> out(positions.size() * rope_dim_);
  fill(positions, out.data());
  return out;
}

}  // namespace moonrun
