#pragma once
// `moonrun serve` options: SGLang's flag names, with the vLLM aliases people type
// (--model, --max-model-len, --gpu-memory-utilization, --max-num-seqs, ...). Flags of the
// two that moonrun has no meaning for are accepted and listed in no_effect_flags (one
// startup warning names them); see cli/serve_flags.cpp.
#include <cstdint>
#include <string>
#include <vector>

#include "engine/draft_source.h"
#include "runtime/defaults.h"

namespace moonrun::server {

struct ServeOptions {
  // Model and identity.
  std::string model_path;           // --model-path / --model / vLLM's positional; empty: the demo model
  std::string served_model_name;    // the first --served-model-name; default: model_path
  std::vector<std::string> served_model_aliases;  // further --served-model-name values
  std::string device = "auto";      // --device cuda|cpu|auto
  std::string dtype = "auto";       // --dtype auto|bfloat16|bf16|float32|fp32: activations and weights
  std::string load_format = "auto"; // --load-format: safetensors variants all read the same bytes
  // Network.
  std::string host = "127.0.0.1";   // --host
  int port = 30000;                 // --port (SGLang's default)
  // Auth: keys from --api-key (repeatable), --api-key-file (one per line) and the
  // MOONRUN_API_KEY / VLLM_API_KEY environment variables. Empty: no auth.
  std::vector<std::string> api_keys;
  bool protect_metrics = false;     // --protect-metrics: /metrics and /health need a key too
  // The built-in chat page at GET / and /chat (docs/chat-page.md); served without a key, it
  // asks for one and sends it on its API calls.
  bool disable_web_ui = false;      // --disable-web-ui
  // CORS (vLLM's flags). Default: any origin, as vLLM and SGLang do; credentials never.
  std::vector<std::string> allowed_origins{"*"};  // --allowed-origins '["https://a"]' or a,b
  std::vector<std::string> allowed_methods{"*"};  // --allowed-methods
  std::vector<std::string> allowed_headers{"*"};  // --allowed-headers
  // HTTP layer limits (docs/architecture.md, "HTTP layer").
  size_t max_request_bytes = 32u << 20;  // --max-request-bytes: 413 beyond (decoded size)
  int max_connections = 4096;       // --max-connections: beyond, the longest-idle one is closed
  int backlog = 2048;               // --backlog: listen(2) queue (the kernel caps it at somaxconn)
  double idle_timeout_s = 15;       // --http-idle-timeout: keep-alive wait for the next request
  double header_timeout_s = 10;     // --http-header-timeout: first byte to the end of the headers
  double body_timeout_s = 60;       // --http-body-timeout: end of headers to the end of the body
  double write_timeout_s = 30;      // --http-write-timeout: a client that reads nothing this long is cut
  int http_threads = 0;             // --http-threads: requests answered at once; 0: running + queued + 64
  int io_threads = 2;               // --http-io-threads: event-loop threads
  // Limits.
  int64_t context_length = 0;       // --context-length / --max-model-len; 0: from config.json
  double mem_fraction_static = 0.0; // --mem-fraction-static / --gpu-memory-utilization; 0: auto
  int max_running_requests = 0;     // --max-running-requests / --max-num-seqs; 0: from the pools
  int chunked_prefill_size = defaults::kChunkedPrefillTokens;  // --chunked-prefill-size / --max-num-batched-tokens
  int64_t max_prefill_attention_pairs = 0;  // --max-prefill-attention-pairs: fair chunking (0: off)
  double max_prefill_step_ms = 0;           // --max-prefill-step-ms: fair chunking by time (0: off)
  int prefill_lane_min_tokens = 0;          // --prefill-lane-min-tokens: long prompts on a second lane (0: off)
  double prefill_lane_step_ms = 0;          // --prefill-lane-step-ms: the shared steps' pace while it works (0: free)
  int max_queued_requests = defaults::kMaxQueuedRequests;  // --max-queued-requests: 503 beyond this many waiting
  double shutdown_timeout_s = 30;   // --shutdown-timeout: SIGTERM lets requests run this long, then cuts
  int page_size_tokens = defaults::kPageSizeTokens;  // --page-size: tokens per MLA KV page
  std::string kv_cache_dtype = "auto";  // --kv-cache-dtype auto|bf16|bfloat16|float32|fp8|fp8_e4m3
  std::string index_cache_dtype = "auto";  // --index-cache-dtype auto|fp8|float32 (K3.1's DSA indexer keys)
  bool disable_radix_cache = false;     // --disable-radix-cache / --no-enable-prefix-caching
  // Speculative decoding (--speculative-config, or SGLang's --speculative-algorithm NGRAM and
  // --speculative-num-draft-tokens): off unless asked.
  SpeculativeConfig speculative;
  bool disable_cuda_graph = false;      // --disable-cuda-graph / --enforce-eager: eager decode steps
  // Images (image_url content parts; docs/api.md "Images").
  bool allow_image_urls = false;            // --allow-image-urls: http(s) image URLs are considered (else 400)
  int64_t max_image_pixels = 64LL << 20;     // --max-image-pixels: declared width x height beyond is a 400
  size_t max_image_bytes = 20u << 20;       // --max-image-bytes: one image's decoded (not base64) bytes
  int max_images_per_request = 16;          // --max-images-per-request
  // Chat.
  std::string reasoning_parser;     // --reasoning-parser kimi_k3|kimi_k2 (default: from model)
  std::string tool_call_parser;     // --tool-call-parser kimi_k3|kimi_k2 (default: from model)
  // Parallelism (used by the multi-GPU backend; validated now).
  int tp_size = 1;                  // --tp-size / --tensor-parallel-size / --tp
  int ep_size = 1;                  // --ep-size / --expert-parallel-size / --ep
  int pp_size = 1;                  // --pp-size / --pipeline-parallel-size: stages of tp_size ranks
  int pp_micro_batches = 0;         // --pp-micro-batches: a step's micro-batches under stages (0: one a stage, 1: none)
  bool split_router = false;        // --split-router: the MoE router split over the TP group
  bool split_latent_moe = false;    // --split-latent-moe(-down): the LatentMoE down projection split
  bool split_latent_up = false;     // --split-latent-moe: and the up projection
  bool dp_attention = false;        // --enable-dp-attention: attention per rank, experts shared
  int nnodes = 1;                   // --nnodes
  int node_rank = 0;                // --node-rank
  std::string dist_init_addr;       // --dist-init-addr HOST:PORT
  double dist_timeout_s = 0;        // --dist-timeout (SGLang): rendezvous/collective timeout; 0: default
  // Logging.
  std::string log_level = "info";   // --log-level trace|debug|info|warning|error|critical
  std::string log_format = "text";  // --log-format text|json
  bool log_requests = true;         // --disable-log-requests turns the per-request line to debug
  // Operations.
  bool dry_run = false;             // --dry-run: print the resolved configuration and exit
  std::vector<std::string> no_effect_flags;  // seen SGLang/vLLM flags with no meaning here
  std::string command_line;         // as given, for the startup dump
  int64_t debug_fail_after_steps = -1;  // --debug-fail-after-steps: fault injection for tests
};

}  // namespace moonrun::server
