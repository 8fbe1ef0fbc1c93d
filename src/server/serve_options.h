#pragma once
// `moonrun serve` options: SGLang's flag names, with the vLLM aliases people type
// (--model, --max-model-len, --gpu-memory-utilization, --max-num-seqs, ...).
#include <cstdint>
#include <string>

#include "runtime/defaults.h"

namespace moonrun::server {

struct ServeOptions {
  // Model and identity.
  std::string model_path;           // --model-path / --model; empty: the embedded demo model
  std::string served_model_name;    // --served-model-name; default: model_path
  std::string device = "auto";      // --device cuda|cpu|auto
  // Network.
  std::string host = "127.0.0.1";   // --host
  int port = 30000;                 // --port (SGLang's default)
  std::string api_key;              // --api-key: Bearer token required on every route but /health
  // Limits.
  int64_t context_length = 0;       // --context-length / --max-model-len; 0: from config.json
  double mem_fraction_static = 0.0; // --mem-fraction-static / --gpu-memory-utilization; 0: auto
  int max_running_requests = 0;     // --max-running-requests / --max-num-seqs; 0: from the pools
  int chunked_prefill_size = defaults::kChunkedPrefillTokens;  // --chunked-prefill-size / --max-num-batched-tokens
  int max_queued_requests = defaults::kMaxQueuedRequests;  // --max-queued-requests: 503 beyond this many waiting
  size_t max_request_bytes = 32u << 20;  // --max-request-bytes: 413 beyond
  double shutdown_timeout_s = 30;   // --shutdown-timeout: SIGTERM drains at most this long
  int page_size_tokens = defaults::kPageSizeTokens;  // --page-size: tokens per KV page
  std::string dtype = "auto";           // --dtype auto|bfloat16|float32
  std::string kv_cache_dtype = "auto";  // --kv-cache-dtype auto|bfloat16|float32 (fp8 refused)
  bool disable_radix_cache = false;     // --disable-radix-cache: no prefix cache
  bool disable_cuda_graph = false;      // --disable-cuda-graph: eager decode steps
  // Chat.
  std::string reasoning_parser;     // --reasoning-parser kimi_k3|kimi_k2 (default: from model)
  std::string tool_call_parser;     // --tool-call-parser kimi_k3|kimi_k2 (default: from model)
  // Parallelism (used by the multi-GPU backend; validated now).
  int tp_size = 1;                  // --tp-size / --tensor-parallel-size
  int ep_size = 1;                  // --ep-size / --expert-parallel-size
  int nnodes = 1;                   // --nnodes
  int node_rank = 0;                // --node-rank
  std::string dist_init_addr;       // --dist-init-addr HOST:PORT
  int http_threads = 128;           // --http-threads: concurrent connections served
  std::string log_level = "info";   // --log-level
  int64_t debug_fail_after_steps = -1;  // --debug-fail-after-steps: fault injection for tests
};

}  // namespace moonrun::server
