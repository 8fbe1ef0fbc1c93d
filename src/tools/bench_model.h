#pragma once
// `moonrun bench-model`: a model's step times on one device, straight through the runner
// (no server, no HTTP): decode steps of b sequences that each already hold `context_tokens`
// in their caches, for every b asked, and the prefill rate of one long prompt. Each decode
// figure is the mean over timed steps after warm-up steps (the first of which captures the
// step's CUDA graph), with sampling on the device and the token ids back on the host, as
// the engine runs them.
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "runtime/runtime_builder.h"

namespace moonrun::tools {

struct ModelBenchConfig {
  std::string model;
  RuntimeOptions runtime;           // device, dtype, memory, graphs
  std::vector<int> batches{1, 8, 32};
  int context_tokens = 128;         // already in each sequence's caches before decoding
  int warmup_steps = 3;
  int decode_steps = 32;
  int prefill_tokens = 0;           // > 0: also time one prompt of this many tokens
  uint64_t seed = 1;
};

struct DecodeFigure {
  int batch = 0;
  double step_ms = 0;        // mean wall time of one decode step (forward + sampling)
  double tok_s = 0;          // batch / step time
  double speedup_vs_b1 = 0;  // tok_s / tok_s at batch 1 (0 when batch 1 was not run)
};

struct ModelBenchReport {
  std::string model, device, dtype;
  bool cuda_graphs = false;
  int context_tokens = 0;
  std::vector<DecodeFigure> decode;
  int prefill_tokens = 0;
  double prefill_s = 0, prefill_tok_s = 0;
};

Result<ModelBenchReport> run_model_bench(const ModelBenchConfig& config);
// The table, with the ratio to batch 1 last.
std::string format_model_bench(const ModelBenchReport& report);
nlohmann::json model_bench_to_json(const ModelBenchReport& report);

}  // namespace moonrun::tools
