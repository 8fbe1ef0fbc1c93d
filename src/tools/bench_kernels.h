#pragma once
// Issue #12's kernel comparisons at Kimi K3's widths (and issue #40's INT4 routed experts at
// Kimi K2's: tools/bench_kernels.cpp, kK2Shapes), driven through the ops interface on one
// backend with random inputs (no checkpoint): the MXFP4 routed-expert op for 16 experts x
// 1-8 tokens each (latent 3584, FFN 3072: one token's top-16 at n = 1), the KDA recurrence of
// one layer (96 heads of 128) as a decode step at batch 1, 32 and 128, and its chunked form
// over one 8,192-token prompt. Each figure stands beside its peer: torch's bf16 grouped GEMM
// measured in the same run (bench/peers/torch_expert_gemm.py, --kernel-peers FILE) or the
// issue's FLA / torch figures, with the speed-up the issue asks for.
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/ops.h"
#include "common/status.h"

namespace moonrun::tools {

struct KernelFigure {
  std::string kernel;     // "moe_experts mxfp4", "kda decode", "kda chunked"
  std::string shape;      // "16 experts x 1 token", "batch 32", "8192 tokens"
  double ms = 0;          // one call, mean over back-to-back calls
  double bytes = 0;       // what the call must move at least (weights / state)
  double peer_ms = 0;     // 0: no peer figure
  std::string peer;       // where peer_ms comes from
  double bar = 0;         // the speed-up over the peer the issue asks for
  double speedup() const { return peer_ms > 0 && ms > 0 ? peer_ms / ms : 0; }
  double gb_s() const { return ms > 0 ? bytes / (ms * 1e-3) / 1e9 : 0; }
};

// `torch_peers`: the JSON bench/peers/torch_expert_gemm.py wrote in this run, or null.
Result<std::vector<KernelFigure>> run_k3_kernel_bench(Ops& ops, const nlohmann::json& torch_peers);
std::string format_kernel_bench(const std::vector<KernelFigure>& figures, double copy_gb_s);
nlohmann::json kernel_bench_to_json(const std::vector<KernelFigure>& figures, double copy_gb_s);

}  // namespace moonrun::tools
