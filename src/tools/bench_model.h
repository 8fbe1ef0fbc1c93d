#pragma once
// `moonrun bench-model`: a model's step times on one device, straight through the runner
// (no server, no HTTP): decode steps of b sequences that each already hold `context_tokens`
// in their caches, for every b asked, and the prefill rate of one long prompt. Each decode
// figure is the mean over timed steps after warm-up steps (the first of which captures the
// step's CUDA graph), with sampling on the device and the token ids back on the host, as
// the engine runs them.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tools/bench_collectives.h"
#include "tools/bench_kernels.h"
#include "common/status.h"
#include "runtime/runtime_builder.h"

namespace moonrun::tools {

struct ModelBenchConfig {
  std::string model;
  RuntimeOptions runtime;           // device, dtype, memory, graphs, tp_size / ep_size
  std::vector<int> batches{1, 8, 32};
  int context_tokens = 128;         // already in each sequence's caches before decoding
  int warmup_steps = 3;
  int decode_steps = 32;
  int prefill_tokens = 0;           // > 0: also time one prompt of this many tokens, in chunks of
                                    // runtime.max_tokens_per_step (--chunked-prefill-size)
  bool profile = true;              // per-op tables (extra, eager steps after the timed ones)
  int profile_steps = 3;
  std::string commit;               // recorded in the JSON
  uint64_t seed = 1;
  bool kernels = false;             // also the K3-width kernel comparisons (tools/bench_kernels.h), GPU only
  std::string kernel_peers_json;    // bench/peers/torch_expert_gemm.py's output from this run, if any
  // Speculative decoding: also time verify steps where each sequence brings its last token
  // and k drafts, for each k here (> 0), every draft rejected (a rollback each step: the
  // dearest case).
  std::vector<int> draft_tokens;
  // The prefill lane (issue #47): > 0 also times, per batch size, decode steps while a chunk
  // of this many tokens (after --context tokens of its prompt) runs on the lane, against each
  // alone: what a decode step costs beside a long prompt's chunk, and the chunk beside it.
  int lane_chunk_tokens = 0;
  int lane_chunks = 3;  // timed chunks per batch size (after one untimed)
};

// Decode steps beside a prefill-lane chunk (ModelBenchConfig::lane_chunk_tokens).
struct LaneFigure {
  int batch = 0;
  int chunk_tokens = 0, chunk_context = 0;  // the chunk: tokens, and its prompt's tokens before it
  double decode_ms_alone = 0, decode_ms_beside = 0;  // mean decode step, alone / while the chunk runs
  double chunk_ms_alone = 0, chunk_ms_beside = 0;    // the chunk alone / beside the decode steps (seen
                                                     // at the first decode step to end after it)
  double decode_steps_per_chunk = 0;  // decode steps that ran while a chunk did
};

// One op's share of a profiled step (backend/op_profile.h), per step.
struct OpFigure {
  std::string op;
  double calls = 0, ms = 0, bytes = 0, flops = 0;
};

// The bytes one decode step must move at least, by part: the floor's terms.
struct StepBytes {
  double dense = 0;        // every weight but the embedding table and the routed experts
  double experts = 0;      // expected distinct experts for the batch, every MoE layer
  double kv_cache = 0;     // each sequence's cached rows, read once
  double state = 0;        // each sequence's recurrent state, read and written
  double total() const { return dense + experts + kv_cache + state; }
};

struct DecodeFigure {
  int batch = 0;
  int draft_tokens = 0;      // > 0: a speculative verify step (1 + k tokens a sequence)
  double step_ms = 0;        // mean wall time of one decode step (forward + sampling)
  double tok_s = 0;          // batch / step time
  double speedup_vs_b1 = 0;  // tok_s / tok_s at batch 1 (0 when batch 1 was not run)
  StepBytes bytes;           // what the floor counts
  double flops = 0;          // what a step must compute (decode_step_flops)
  // batch / max(bytes / measured copy bandwidth, flops / measured bf16 GEMM peak): the step
  // can beat neither; 0 without the measurements. floor_binds says which side set it.
  double floor_tok_s = 0;
  double floor_ratio = 0;    // tok_s / floor_tok_s
  const char* floor_binds = "bytes";  // "bytes" or "flops"
  double expected_experts = 0;  // distinct experts per MoE layer, uniform routing
  double profiled_experts = 0;  // distinct experts per MoE layer the profiled steps read (0: not profiled)
  std::vector<OpFigure> ops;    // the profiled step, largest first
  double profiled_step_ms = 0;  // the ops' sum in the profiled (eager, synchronised) steps
};

// Figures another engine reached on the same model shape (for the ratios), and the floor
// its publisher computed.
struct PeerFigures {
  std::string source;
  std::vector<std::pair<int, double>> decode_tok_s;  // (batch, tok/s)
  std::vector<std::pair<int, double>> floor_tok_s;
  double prefill_tok_s = 0;
};

// A row bench-model did not run because its sequences do not fit the cache pools sized
// from the device's memory (or --max-total-tokens): what it needed, what the pool holds.
struct SkippedRow {
  std::string kind;          // "decode", "verify" or "prefill"
  int batch = 0;             // sequences (1 for the prefill row)
  int draft_tokens = 0;      // verify rows: k
  int64_t tokens_each = 0;   // tokens a sequence holds by its last step
  int64_t pages_needed = 0;  // KV pages (with the DSA indexer-key pages, which share their ids)
  int64_t pages_held = 0;    // the pool's
  std::string message;       // one line naming the row, the numbers and the flags that help
};

struct ModelBenchReport {
  std::string model, device, dtype, kv_dtype, gpu, date, commit;
  bool cuda_graphs = false;
  int context_tokens = 0;
  bool caches_prefilled = true;  // false: positions only (the cached values are zeros)
  double copy_gb_s = 0, bf16_tflops = 0;  // measured in this run (GPU); 0 on the CPU
  double weight_bytes = 0;      // one rank's
  int tp_size = 1, ep_size = 1;  // > 1: a group in this process (one GPU a rank); no floor
  double standin_collective_us = -1;  // >= 0: rank 0 of the group alone, stand-in collectives (timing only)
  std::optional<CollectiveBench> collectives;  // tp_size > 1: the group's all-reduces, timed alone
  std::vector<DecodeFigure> decode;
  std::vector<DecodeFigure> verify;  // ModelBenchConfig::draft_tokens
  int prefill_tokens = 0;
  int prefill_chunk_tokens = 0;   // the prompt went through in steps of this many tokens
  int mla_layers = 0;
  double prefill_attention_flops = 0;  // prompt_attention_flops of the prompt
  double prefill_s = 0, prefill_tok_s = 0;
  double prefill_tflops = 0;      // counted GEMM/attention FLOPs / prefill time (needs the profile)
  double prefill_peak_ratio = 0;  // prefill_tflops / bf16_tflops
  std::vector<OpFigure> prefill_ops;
  std::optional<PeerFigures> peer;
  std::vector<KernelFigure> kernels;  // --kernels
  std::vector<SkippedRow> skipped;    // rows that do not fit the pools (the rest still ran)
  std::vector<LaneFigure> lane;       // --lane-chunk
};

// Issue #12's llama.cpp figures for the K3-width 3-layer slice at 4k context on one H200,
// when the model has that shape (hidden 7168, 896 experts, 3 layers); nullopt otherwise.
std::optional<PeerFigures> k3_slice_peer(const ModelConfig& config);
// Bytes a decode step of `batch` sequences at `context` tokens must move (see StepBytes).
StepBytes decode_step_bytes(const ModelConfig& config, int64_t weight_bytes, bool bf16_weights,
                            const CacheLayout& layout, int batch, int context, double* expected_experts = nullptr);

// FLOPs a decode step of `batch` sequences, each bringing `tokens_each` tokens (1, or 1 + k
// verified drafts) at `context` cached tokens, must compute: 2 per multiply-add of the dense
// weights (from bytes.dense) and of each token's top-k experts, and the absorbed MLA
// attention over the context (scores over kv_lora + rope, values over kv_lora, every head,
// every full-attention layer). At long contexts the attention is what can bind: with 96
// heads a cached byte costs ~181 FLOPs, on the H200's ridge (issue 47).
double decode_step_flops(const ModelConfig& config, const StepBytes& bytes, bool bf16_weights, int batch,
                         int tokens_each, int context);

// The causal attention FLOPs of an n-token prompt through the model's full-attention
// layers (scores and weighted values of every visible pair, every head).
double prompt_attention_flops(const ModelConfig& config, int64_t n_tokens);

// Rows whose sequences do not fit the KV page pool (or the state slots) are skipped, each
// with a SkippedRow in the report; fails (resource exhausted) when no row fits at all.
// runtime.max_total_tokens > 0 caps the KV pool as in serve (--max-total-tokens).
Result<ModelBenchReport> run_model_bench(const ModelBenchConfig& config);
// The tables: decode (with the floor and peer ratios last), prefill, then one per-op table
// per profiled step.
std::string format_model_bench(const ModelBenchReport& report);
nlohmann::json model_bench_to_json(const ModelBenchReport& report);

}  // namespace moonrun::tools
