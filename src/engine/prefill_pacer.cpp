#include "engine/prefill_pacer.h"

#include <algorithm>
#include <cmath>

namespace moonrun {

namespace {
// Features scaled to order 1 for the solve: tokens in thousands, pairs in billions.
constexpr double kTokenUnit = 1e3, kPairUnit = 1e9;
constexpr double kRidge = 1e-6;
}  // namespace

void PrefillPacer::record(int64_t tokens, int64_t pairs, int64_t context, double seconds) {
  const double all_pairs = static_cast<double>(pairs) + context_pairs_ * static_cast<double>(context);
  const double x[3] = {1.0, static_cast<double>(tokens) / kTokenUnit, all_pairs / kPairUnit};
  for (int i = 0; i < 3; ++i) {
    for (int j = 0; j < 3; ++j) xtx_[i][j] = kDecay * xtx_[i][j] + x[i] * x[j];
    xty_[i] = kDecay * xty_[i] + x[i] * seconds;
  }
  if (pairs > 0) ++prefill_steps_;
}

std::array<double, 3> PrefillPacer::fit() const {
  // Gaussian elimination with partial pivoting on (X^T X + ridge I) w = X^T y.
  double m[3][4];
  for (int i = 0; i < 3; ++i) {
    for (int j = 0; j < 3; ++j) m[i][j] = xtx_[i][j] + (i == j ? kRidge : 0.0);
    m[i][3] = xty_[i];
  }
  for (int col = 0; col < 3; ++col) {
    int pivot = col;
    for (int r = col + 1; r < 3; ++r)
      if (std::abs(m[r][col]) > std::abs(m[pivot][col])) pivot = r;
    if (std::abs(m[pivot][col]) < 1e-300) return {0, 0, 0};
    for (int j = 0; j < 4; ++j) std::swap(m[col][j], m[pivot][j]);
    for (int r = 0; r < 3; ++r) {
      if (r == col) continue;
      const double f = m[r][col] / m[col][col];
      for (int j = col; j < 4; ++j) m[r][j] -= f * m[col][j];
    }
  }
  return {m[0][3] / m[0][0], m[1][3] / m[1][1] / kTokenUnit, m[2][3] / m[2][2] / kPairUnit};
}

Scheduler::PrefillBudget PrefillPacer::budget(double target_s) const {
  const auto [fixed_s, per_token_s, per_pair_s] = fit();
  const double fixed = std::max(fixed_s, 0.0);
  return {std::max(target_s - fixed, fixed), std::max(per_token_s, 0.0), per_pair_s,
          std::max(per_pair_s, 0.0) * context_pairs_, fixed};
}

}  // namespace moonrun
