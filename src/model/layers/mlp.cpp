#include "model/layers/mlp.h"

namespace moonrun {

void mlp_forward(Ops& ops, const MlpWeights& w, const ActivationParams& act, const Tensor& x, Tensor out,
                 bool reduce) {
  ScratchScope scope(ops);
  const int64_t T = x.rows;
  Tensor g = ops.scratch(T, w.gate.out, DType::F32);  // [T, inter]
  Tensor u = ops.scratch(T, w.up.out, DType::F32);
  ops.linear(x, w.gate, g);
  ops.linear(x, w.up, u);
  Tensor h = ops.act_dtype() == DType::F32 ? g : ops.scratch(T, w.gate.out, ops.act_dtype());
  ops.gated_activation(g, u, act, h);
  ops.linear(h, w.down, out);
  if (reduce) ops.all_reduce_sum(out);  // down is row-parallel: each rank's intermediate slice contributes
}

}  // namespace moonrun
