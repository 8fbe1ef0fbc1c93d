#include "cli/serve_flags.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <fstream>

#include <nlohmann/json.hpp>

#include "common/log.h"

namespace moonrun::cli {

namespace {

// Flags of SGLang's and vLLM's servers that have no meaning in moonrun: the kernel and
// backend choices moonrun makes itself, Python/PyTorch runtime knobs, features it does not
// have yet. Each is accepted (so a pasted launch line starts) and named in the startup
// warning. `value`: whether the flag takes a value.
struct NoEffectFlag {
  const char* names;  // CLI11 spelling: "--a,--b"
  bool value;
  const char* why;
};
constexpr NoEffectFlag kNoEffect[] = {
    // SGLang (the seeds' lines and the cookbook's)
    {"--moe-runner-backend", true, "moonrun picks its MoE kernels"},
    {"--decode-attention-backend", true, "moonrun picks its attention kernels"},
    {"--prefill-attention-backend", true, "moonrun picks its attention kernels"},
    {"--attention-backend", true, "moonrun picks its attention kernels"},
    {"--sampling-backend", true, "moonrun samples on the model's device"},
    {"--enable-symm-mem", false, "no symmetric-memory all-reduce yet"},
    {"--mm-feature-transport", true, "no vision encoder yet"},
    {"--mamba-full-memory-ratio", true, "KDA state slots are sized from --max-running-requests"},
    {"--max-total-tokens", true, "the KV pool is sized from --mem-fraction-static"},
    {"--max-prefill-tokens", true, "the step budget is --chunked-prefill-size"},
    {"--schedule-policy", true, "the scheduler is FCFS"},
    {"--cuda-graph-max-bs", true, "CUDA graph sizes are moonrun's"},
    {"--enable-torch-compile", false, "no PyTorch"},
    {"--watchdog-timeout", true, "a failed step fails its requests at once"},
    {"--random-seed", true, "requests take a seed each"},
    {"--chat-template", true, "the chat format comes from the checkpoint (K3 XTML or K2)"},
    {"--quantization", true, "the checkpoint's MXFP4 experts are used as published"},
    {"--speculative-num-steps", true, "the NGRAM drafts come from one lookup, not draft-model steps"},
    {"--speculative-eagle-topk", true, "drafts are one chain, not an EAGLE tree"},
    {"--show-time-cost", false, "per-request timings are in the request log line"},
    {"--enable-metrics", false, "/metrics is always on"},
    {"--skip-server-warmup", false, "there is no warm-up"},
    {"--tokenizer-path,--tokenizer", true, "the tokenizer comes from the checkpoint directory"},
    {"--tokenizer-mode", true, "the tokenizer comes from the checkpoint directory"},
    {"--revision", true, "the HF cache snapshot found locally is used"},
    {"--download-dir", true, "moonrun reads $HF_HOME/hub; it downloads nothing"},
    // vLLM (the seeds' recipe and common ones)
    {"--load-format", true, "safetensors are memory-mapped whatever the loader"},
    {"--disable-flashinfer-autotune", false, "no FlashInfer"},
    {"--attention-config", true, "moonrun picks its attention kernels"},
    {"--enable-prefix-caching", false, "the prefix cache is on by default"},
    {"--prefix-match-unit", true, "prefixes are cached at 256-token blocks (the KDA state snapshots)"},
    {"--swap-space", true, "no CPU swap of the KV cache"},
    {"--seed", true, "requests take a seed each"},
    {"--distributed-executor-backend", true, "moonrun runs one process per node"},
    {"--max-logprobs", true, "top_logprobs is capped at 20"},
    {"--limit-mm-per-prompt", true, "no vision encoder yet"},
    {"--mm-processor-kwargs", true, "no vision encoder yet"},
    {"--compilation-config", true, "no torch.compile"},
    {"--hf-overrides", true, "config.json is read as published"},
    {"--generation-config", true, "sampling defaults are OpenAI's"},
    {"--async-scheduling", false, "the engine loop already overlaps HTTP and steps"},
    {"--cuda-graph-sizes", true, "CUDA graph sizes are moonrun's"},
    {"--max-seq-len-to-capture", true, "CUDA graph sizes are moonrun's"},
    {"--disable-log-stats", false, "stats are in /metrics, not the log"},
    {"--uvicorn-log-level", true, "use --log-level"},
    {"--disable-uvicorn-access-log", false, "use --disable-log-requests"},
    {"--response-role", true, "the role is always assistant"},
    {"--disable-custom-all-reduce", false, "collectives are moonrun's"},
};

std::string trim(std::string s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
  size_t b = 0;
  while (b < s.size() && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  return s.substr(b);
}

// vLLM writes lists as JSON ('["https://a.example"]'); a comma list is accepted too.
Result<std::vector<std::string>> parse_list(const std::string& flag, const std::string& text) {
  std::vector<std::string> out;
  const std::string t = trim(text);
  if (!t.empty() && t[0] == '[') {
    auto j = nlohmann::json::parse(t, nullptr, false);
    if (j.is_discarded() || !j.is_array()) return invalid_argument(flag + ": not a JSON list: " + text);
    for (const auto& v : j) {
      if (!v.is_string()) return invalid_argument(flag + ": every entry must be a string");
      out.push_back(v.get<std::string>());
    }
    return out;
  }
  size_t start = 0;
  while (start <= t.size()) {
    const size_t comma = t.find(',', start);
    std::string item = trim(t.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (!item.empty()) out.push_back(item);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

std::string first_name(const char* names) {
  std::string s(names);
  return s.substr(0, s.find(','));
}

}  // namespace

Status resolve_speculative_flags(const ServeFlags& flags, SpeculativeConfig& sc) {
  auto method_of = [](std::string name, SpecMethod& m) -> Status {
    for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (name == "ngram" || name == "prompt_lookup") {
      m = SpecMethod::kNgram;
      return Status::ok();
    }
    if (name == "suffix") {
      m = SpecMethod::kSuffix;
      return Status::ok();
    }
    if (name == "dspark") {
      m = SpecMethod::kDSpark;
      return Status::ok();
    }
    return invalid_argument("speculative decoding method '" + name +
                            "' is not available; moonrun has: ngram, suffix, dspark (with its draft model)");
  };
  if (!flags.speculative_config.empty()) {
    const auto j = nlohmann::json::parse(flags.speculative_config, nullptr, false);
    if (j.is_discarded() || !j.is_object()) return invalid_argument("--speculative-config: not a JSON object");
    for (const auto& [key, value] : j.items()) {
      auto int_of = [&](int& out) -> Status {
        if (!value.is_number_integer()) return invalid_argument("--speculative-config: " + key + " must be an integer");
        out = value.get<int>();
        return Status::ok();
      };
      if (key == "method") {
        if (!value.is_string()) return invalid_argument("--speculative-config: method must be a string");
        MR_RETURN_IF_ERROR(method_of(value.get<std::string>(), sc.method));
      } else if (key == "num_speculative_tokens") {
        MR_RETURN_IF_ERROR(int_of(sc.num_speculative_tokens));
      } else if (key == "prompt_lookup_min") {
        MR_RETURN_IF_ERROR(int_of(sc.prompt_lookup_min));
      } else if (key == "prompt_lookup_max") {
        MR_RETURN_IF_ERROR(int_of(sc.prompt_lookup_max));
      } else if (key == "disable_by_batch_size") {
        MR_RETURN_IF_ERROR(int_of(sc.disable_by_batch_size));
      } else if (key == "suffix_decoding_max_tree_depth") {
        MR_RETURN_IF_ERROR(int_of(sc.suffix_max_tree_depth));
      } else if (key == "suffix_decoding_max_cached_requests") {
        MR_RETURN_IF_ERROR(int_of(sc.suffix_max_cached_requests));
      } else if (key == "suffix_decoding_max_spec_factor" || key == "suffix_decoding_min_token_prob") {
        if (!value.is_number()) return invalid_argument("--speculative-config: " + key + " must be a number");
        (key == "suffix_decoding_max_spec_factor" ? sc.suffix_max_spec_factor : sc.suffix_min_token_prob) =
            value.get<double>();
      } else if (key == "model") {
        if (!value.is_null() && !value.is_string())
          return invalid_argument("--speculative-config: model must be a path or a hub repo id");
        if (value.is_string()) sc.draft_model = value.get<std::string>();
      } else if (key == "confidence_threshold") {
        if (!value.is_number()) return invalid_argument("--speculative-config: confidence_threshold must be a number");
        sc.dspark_confidence_threshold = value.get<double>();
      } else if (key == "draft_sample_method" || key == "rejection_sample_method") {
        // The DSpark recipes' fields: moonrun drafts greedily and verifies by rejection
        // sampling against the one proposed token (lossless either way).
        if (!value.is_string()) return invalid_argument("--speculative-config: " + key + " must be a string");
      } else {
        return invalid_argument("--speculative-config: unknown field '" + key +
                                "' (known: method, num_speculative_tokens, prompt_lookup_min, prompt_lookup_max, "
                                "disable_by_batch_size, suffix_decoding_max_tree_depth, "
                                "suffix_decoding_max_cached_requests, suffix_decoding_max_spec_factor, "
                                "suffix_decoding_min_token_prob, model, confidence_threshold)");
      }
    }
    if (sc.method == SpecMethod::kNone) return invalid_argument("--speculative-config: method is missing");
    if (sc.method == SpecMethod::kDSpark && !j.contains("num_speculative_tokens")) sc.num_speculative_tokens = 7;
    if (sc.method != SpecMethod::kDSpark && !sc.draft_model.empty())
      return invalid_argument(std::string("--speculative-config: method ") + spec_method_name(sc.method) +
                              " takes no draft model");
    // vLLM: suffix decoding sizes its drafts itself; num_speculative_tokens, when not given, is
    // the tree depth (a bound, not a count).
    if (sc.method == SpecMethod::kSuffix && !j.contains("num_speculative_tokens"))
      sc.num_speculative_tokens = std::min(sc.suffix_max_tree_depth, 32);
    // vLLM: prompt_lookup_min defaults to prompt_lookup_max when only that is given.
    if (j.contains("prompt_lookup_max") && !j.contains("prompt_lookup_min"))
      sc.prompt_lookup_min = std::min(sc.prompt_lookup_min, sc.prompt_lookup_max);
  }
  if (!flags.speculative_algorithm.empty()) {
    if (!flags.speculative_config.empty())
      return invalid_argument("--speculative-algorithm and --speculative-config both given: use one");
    MR_RETURN_IF_ERROR(method_of(flags.speculative_algorithm, sc.method));
    sc.num_speculative_tokens = flags.speculative_num_draft_tokens > 0 ? flags.speculative_num_draft_tokens - 1 : 4;
    if (flags.speculative_ngram_min > 0) sc.prompt_lookup_min = flags.speculative_ngram_min;
    if (flags.speculative_ngram_max > 0) sc.prompt_lookup_max = flags.speculative_ngram_max;
    if (sc.method == SpecMethod::kDSpark && flags.speculative_num_draft_tokens <= 0) sc.num_speculative_tokens = 7;
    sc.draft_model = flags.speculative_draft_model_path;
    if (sc.method != SpecMethod::kDSpark && !sc.draft_model.empty())
      return invalid_argument("--speculative-draft-model-path: the " + flags.speculative_algorithm +
                              " algorithm takes no draft model");
  } else if (!flags.speculative_draft_model_path.empty() && flags.speculative_config.empty()) {
    return invalid_argument("--speculative-draft-model-path needs --speculative-algorithm DSPARK");
  } else if (flags.speculative_num_draft_tokens > 0 && flags.speculative_config.empty()) {
    return invalid_argument("--speculative-num-draft-tokens needs --speculative-algorithm NGRAM");
  }
  if (sc.method != SpecMethod::kNone && sc.num_speculative_tokens == 0 && flags.speculative_config.empty())
    return invalid_argument("--speculative-num-draft-tokens must be >= 2 (the last accepted token and one draft)");
  return check_speculative_config(sc);
}

void add_serve_flags(CLI::App* cmd, const std::shared_ptr<ServeFlags>& flags) {
  server::ServeOptions& o = flags->options;
  // vLLM's `vllm serve MODEL`: the same as --model-path.
  cmd->add_option("model", flags->positional_model, "Checkpoint directory or HF repo id (vLLM's positional form)");
  cmd->add_option("--model-path,--model", o.model_path,
                  "Checkpoint directory or Hugging Face repo id (default: the demo model)");
  cmd->add_option("--served-model-name", flags->served_model_names,
                  "Model name(s) in the API; the first is listed, all are accepted (default: the model path)")
      ->expected(1, 16);
  cmd->add_option("--device", o.device, "cpu | cuda | auto")->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  cmd->add_option("--dtype", o.dtype,
                  "auto | bfloat16 | float32 (GPU: bf16 by default, float32 runs every op in fp32 to check kernels; "
                  "CPU: float32 only); half/float16 are refused (K3 is not run in fp16)")
      ->check(CLI::IsMember({"auto", "bfloat16", "bf16", "half", "float16", "float", "float32", "fp32"}));
  cmd->add_option("--host", o.host, "Address to listen on")->capture_default_str();
  cmd->add_option("--port", o.port, "Port to listen on")->capture_default_str()->check(CLI::Range(0, 65535));
  cmd->add_option("--api-key", flags->api_keys,
                  "Require 'Authorization: Bearer KEY' (repeatable; also MOONRUN_API_KEY / VLLM_API_KEY)")
      ->expected(1)->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  cmd->add_option("--api-key-file", flags->api_key_file, "File with one API key per line ('#' comments)");
  cmd->add_flag("--protect-metrics", o.protect_metrics, "Require a key on /metrics and /health too (open by default)");
  cmd->add_option("--allowed-origins", flags->allowed_origins,
                  "CORS origins: a JSON list or a comma list (default: *; '' or '[]' turns CORS off)");
  cmd->add_option("--allowed-methods", flags->allowed_methods, "CORS methods (default: *)");
  cmd->add_option("--allowed-headers", flags->allowed_headers, "CORS request headers (default: *)");
  cmd->add_option("--context-length,--max-model-len", o.context_length, "Max prompt + completion tokens (default: the model's)");
  cmd->add_option("--mem-fraction-static,--gpu-memory-utilization", o.mem_fraction_static,
                  "Fraction of memory for weights + cache pools")->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--max-running-requests,--max-num-seqs", o.max_running_requests, "Max sequences in a batch");
  cmd->add_option("--chunked-prefill-size,--max-num-batched-tokens", o.chunked_prefill_size,
                  "Token budget per step (long prompts are prefilled in chunks)")->capture_default_str();
  cmd->add_option("--max-prefill-attention-pairs", o.max_prefill_attention_pairs,
                  "Fair chunking: the query-key pairs a step's prefill chunks may attend over together, per "
                  "attention layer; a chunk late in a long prompt is cut to fit, so other streams' decodes are "
                  "not held up (0: off)")
      ->capture_default_str()->check(CLI::Range(int64_t{0}, int64_t{1} << 50));
  cmd->add_option("--max-prefill-step-ms", o.max_prefill_step_ms,
                  "Fair chunking by time: prefill chunks are cut so that a step carrying one takes about this "
                  "long, from the step costs the engine measures (0: off)")
      ->capture_default_str()->check(CLI::Range(0.0, 1e6));
  cmd->add_option("--prefill-lane-min-tokens", o.prefill_lane_min_tokens,
                  "Prompts of at least this many tokens prefill their chunks on a second lane (a GPU stream of "
                  "lower priority; a tensor-parallel group's lanes with collectives of their own), whole and beside "
                  "the other streams' decode steps, instead of in the steps they share (one GPU or a --tp-size "
                  "group on one node; beside a DSpark draft too; not with --pp-size or DP attention; 0: off)")
      ->capture_default_str()->check(CLI::Range(0, 1 << 30));
  cmd->add_option("--prefill-lane-step-ms", o.prefill_lane_step_ms,
                  "While a long prompt's chunk is on the prefill lane, the shared steps start at most every this "
                  "many ms, leaving the lane the rest of the GPU: the other streams' inter-token latency traded for "
                  "the long prompt's time to first token (0: back to back)")
      ->capture_default_str()->check(CLI::Range(0.0, 1e4));
  cmd->add_option("--max-queued-requests", o.max_queued_requests, "Waiting requests beyond this get 503")->capture_default_str();
  cmd->add_option("--max-request-bytes", o.max_request_bytes, "Larger request bodies (after decoding) get 413")
      ->capture_default_str()->check(CLI::Range(size_t{1024}, size_t{1} << 34));
  cmd->add_option("--shutdown-timeout", o.shutdown_timeout_s,
                  "Seconds SIGTERM lets running requests go on before it cuts them")->capture_default_str()
      ->check(CLI::Range(0.0, 86400.0));
  cmd->add_option("--page-size,--block-size", o.page_size_tokens, "Tokens per KV-cache page")->capture_default_str();
  cmd->add_option("--kv-cache-dtype", o.kv_cache_dtype,
                  "auto (the compute dtype) | bf16 | float32 | fp8 (= fp8_e4m3: half the cache bytes of bf16)")
      ->check(CLI::IsMember({"auto", "bf16", "bfloat16", "float32", "fp32", "fp8", "fp8_e4m3", "fp8_e5m2"}));
  cmd->add_option("--index-cache-dtype", o.index_cache_dtype,
                  "K3.1's DSA indexer keys: auto (fp8 with a scale in bf16, as DeepSeek-V3.2; float32 with "
                  "--dtype float32) | fp8 | float32")
      ->check(CLI::IsMember({"auto", "fp8", "fp8_e4m3", "float32", "fp32"}))->capture_default_str();
  cmd->add_flag("--disable-radix-cache,--no-enable-prefix-caching", o.disable_radix_cache,
                "Turn the prefix cache off (prompts sharing a prefix are then prefilled in full)");
  cmd->add_flag("--disable-cuda-graph,--enforce-eager", o.disable_cuda_graph,
                "Run decode steps eagerly instead of replaying captured CUDA graphs");
  cmd->add_flag("--allow-image-urls", o.allow_image_urls,
                "Consider http(s) image URLs (off: they are 400s; this server never fetches them, it takes data: URIs)");
  cmd->add_option("--max-image-pixels", o.max_image_pixels,
                  "Images whose header declares more pixels (width x height) get 400 before decoding")
      ->capture_default_str()->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
  cmd->add_option("--max-image-bytes", o.max_image_bytes, "Larger images (decoded from base64) get 400")
      ->capture_default_str()->check(CLI::Range(size_t{1}, size_t{1} << 34));
  cmd->add_option("--max-images-per-request", o.max_images_per_request, "More images in one request get 400")
      ->capture_default_str()->check(CLI::Range(0, 4096));
  cmd->add_option("--reasoning-parser", o.reasoning_parser, "kimi_k3 | kimi_k2 (default: from the model)");
  cmd->add_option("--tool-call-parser", o.tool_call_parser, "kimi_k3 | kimi_k2 (default: from the model)");
  cmd->add_option("--tp-size,--tensor-parallel-size,--tp", o.tp_size, "Tensor-parallel size")->capture_default_str();
  cmd->add_option("--ep-size,--expert-parallel-size,--ep", o.ep_size, "Expert-parallel size")->capture_default_str();
  cmd->add_flag("--enable-expert-parallel", flags->enable_expert_parallel, "vLLM: expert parallel over the TP ranks");
  cmd->add_flag("--split-router", o.split_router,
                "split the fp32 MoE router over the TP ranks by expert (its logits all-gathered) instead of replicating it");
  cmd->add_flag_callback(
      "--split-latent-moe", [flags] { flags->options.split_latent_moe = flags->options.split_latent_up = true; },
      "split the LatentMoE down and up projections over the TP ranks (an all-gather and an all-reduce more a MoE "
      "layer) instead of replicating them");
  cmd->add_flag_callback(
      "--split-latent-moe-down", [flags] { flags->options.split_latent_moe = true; },
      "split only the LatentMoE down projection over the TP ranks (an all-gather more a MoE layer); the up projection "
      "stays whole, so the routed sum rides the shared experts' all-reduce");
  cmd->add_option("--pipeline-parallel-size,--pp-size", flags->pipeline_parallel_size,
                  "Pipeline stages of contiguous layers, each a --tp-size group (tp x pp ranks in all)");
  cmd->add_option("--pp-micro-batches", o.pp_micro_batches,
                  "Pipeline stages: a step of several sequences runs as up to this many micro-batches, so earlier "
                  "stages go on while later ones work (0: one a stage, 1: none)")
      ->capture_default_str();
  cmd->add_option("--data-parallel-size,--dp-size", flags->data_parallel_size,
                  "1 (run one server per replica), or with --enable-dp-attention the --tp-size");
  cmd->add_flag("--enable-dp-attention", flags->enable_dp_attention,
                "SGLang: each TP rank runs attention (held whole) for its own sequences; the routed experts stay "
                "split over the ranks (--ep-size), every MoE layer gathering all ranks' tokens");
  cmd->add_option("--nnodes", o.nnodes, "Number of nodes")->capture_default_str();
  cmd->add_option("--node-rank", o.node_rank, "This node's rank")->capture_default_str();
  cmd->add_option("--dist-init-addr", o.dist_init_addr, "HOST:PORT of node 0's rendezvous");
  cmd->add_option("--dist-timeout", o.dist_timeout_s, "Seconds before a missing node is an error");
  cmd->add_option("--http-threads", o.http_threads, "Requests answered at once (0: running + queued + 64)")->capture_default_str();
  cmd->add_option("--http-io-threads", o.io_threads, "Event-loop threads")->capture_default_str()->check(CLI::Range(1, 64));
  cmd->add_option("--max-connections", o.max_connections, "Open connections; beyond, the longest-waiting is closed")
      ->capture_default_str()->check(CLI::Range(8, 1 << 20));
  cmd->add_option("--backlog", o.backlog, "listen() backlog")->capture_default_str();
  cmd->add_option("--http-idle-timeout", o.idle_timeout_s, "Keep-alive wait for the next request (s)")->capture_default_str();
  cmd->add_option("--http-header-timeout", o.header_timeout_s, "Deadline for a request's headers (s)")->capture_default_str();
  cmd->add_option("--http-body-timeout", o.body_timeout_s, "Deadline for a request's body (s)")->capture_default_str();
  cmd->add_option("--http-write-timeout", o.write_timeout_s, "A client that reads nothing this long is cut (s)")
      ->capture_default_str();
  cmd->add_option("--log-level", o.log_level, "trace | debug | info | warning | error | critical")->capture_default_str();
  cmd->add_option("--log-format", o.log_format, "text | json")->capture_default_str()->check(CLI::IsMember({"text", "json"}));
  cmd->add_flag("--disable-log-requests", flags->disable_log_requests, "Per-request log lines at debug level only");
  static bool enable_log_requests = false;  // vLLM's newer spelling of the default
  cmd->add_flag("--enable-log-requests,--log-requests", enable_log_requests, "One log line per request (the default)");
  cmd->add_flag("--dry-run", o.dry_run, "Print the resolved configuration and the warnings, then exit");
  static bool always_on = false;
  cmd->add_flag("--enable-auto-tool-choice", always_on, "Tool calls are always parsed (accepted for vLLM lines)");
  cmd->add_option("--speculative-config", flags->speculative_config,
                  "vLLM's speculative decoding JSON: {\"method\": \"ngram\", \"num_speculative_tokens\": K, "
                  "\"prompt_lookup_min\": 2, \"prompt_lookup_max\": 5, \"disable_by_batch_size\": N}, or "
                  "{\"method\": \"suffix\"} with suffix_decoding_max_tree_depth (24), _max_cached_requests (10000), "
                  "_max_spec_factor (1.0), _min_token_prob (0.1)");
  cmd->add_option("--speculative-algorithm", flags->speculative_algorithm,
                  "SGLang: NGRAM (prompt lookup drafts), DSPARK (a DSpark draft model)");
  cmd->add_option("--speculative-draft-model-path", flags->speculative_draft_model_path,
                  "SGLang: the DSpark draft checkpoint (directory or hub repo id)");
  cmd->add_option("--speculative-num-draft-tokens", flags->speculative_num_draft_tokens,
                  "SGLang: tokens a verify step holds per sequence, the last accepted one included (drafts = this - 1)");
  cmd->add_option("--speculative-ngram-min-match-window-size", flags->speculative_ngram_min,
                  "SGLang: the shortest suffix n-gram that proposes drafts (vLLM's prompt_lookup_min)");
  cmd->add_option("--speculative-ngram-max-match-window-size", flags->speculative_ngram_max,
                  "SGLang: the longest suffix n-gram tried first (vLLM's prompt_lookup_max)");
  cmd->add_option("--debug-fail-after-steps", o.debug_fail_after_steps, "Testing: make the backend fail after N engine steps")
      ->group("");
  // --trust-remote-code: moonrun runs no code from checkpoints, so there is nothing to trust.
  auto add_ignored = [&](const char* names, bool value, const char* why) {
    flags->ignored_values.emplace_back();
    std::string& storage = flags->ignored_values.back();
    CLI::Option* opt = value ? cmd->add_option(names, storage, std::string("No effect in moonrun: ") + why)
                             : cmd->add_flag(std::string(names))->description(std::string("No effect in moonrun: ") + why);
    opt->group("Accepted from SGLang/vLLM, no effect");
    flags->ignored.emplace_back(opt, first_name(names));
  };
  add_ignored("--trust-remote-code", false, "moonrun runs no code from checkpoints");
  for (const NoEffectFlag& f : kNoEffect) add_ignored(f.names, f.value, f.why);
}

Status finish_serve_flags(ServeFlags& flags, const std::vector<std::string>& argv) {
  server::ServeOptions& o = flags.options;
  if (!flags.positional_model.empty()) {
    if (!o.model_path.empty() && o.model_path != flags.positional_model)
      return invalid_argument("the model is given twice: '" + flags.positional_model + "' and --model-path '" +
                              o.model_path + "'");
    o.model_path = flags.positional_model;
  }
  if (!flags.served_model_names.empty()) {
    o.served_model_name = flags.served_model_names[0];
    o.served_model_aliases.assign(flags.served_model_names.begin() + 1, flags.served_model_names.end());
  }
  // API keys: flags, file, environment (vLLM reads VLLM_API_KEY).
  for (const auto& k : flags.api_keys)
    if (!k.empty()) o.api_keys.push_back(k);
  if (!flags.api_key_file.empty()) {
    std::ifstream in(flags.api_key_file);
    if (!in) return invalid_argument("--api-key-file " + flags.api_key_file + ": cannot be read");
    std::string line;
    int n = 0;
    while (std::getline(in, line)) {
      line = trim(line);
      if (line.empty() || line[0] == '#') continue;
      o.api_keys.push_back(line);
      ++n;
    }
    if (n == 0) return invalid_argument("--api-key-file " + flags.api_key_file + ": holds no key");
  }
  for (const char* env : {"MOONRUN_API_KEY", "VLLM_API_KEY"})
    if (const char* v = std::getenv(env); v && *v) o.api_keys.push_back(trim(v));
  if (o.protect_metrics && o.api_keys.empty())
    return invalid_argument("--protect-metrics needs an API key (--api-key, --api-key-file or MOONRUN_API_KEY)");
  // CORS lists.
  if (!flags.allowed_origins.empty() || std::find(argv.begin(), argv.end(), "--allowed-origins") != argv.end()) {
    auto l = parse_list("--allowed-origins", flags.allowed_origins);
    if (!l.is_ok()) return l.status();
    o.allowed_origins = *l;
  }
  if (!flags.allowed_methods.empty()) {
    auto l = parse_list("--allowed-methods", flags.allowed_methods);
    if (!l.is_ok()) return l.status();
    o.allowed_methods = *l;
  }
  if (!flags.allowed_headers.empty()) {
    auto l = parse_list("--allowed-headers", flags.allowed_headers);
    if (!l.is_ok()) return l.status();
    o.allowed_headers = *l;
  }
  LogLevel level;
  if (!parse_log_level(o.log_level, level))
    return invalid_argument("--log-level " + o.log_level + ": use trace, debug, info, warning, error or critical");
  o.log_requests = !flags.disable_log_requests;
  if (flags.enable_expert_parallel && o.ep_size == 1) o.ep_size = o.tp_size;
  if (flags.pipeline_parallel_size < 1)
    return invalid_argument("--pipeline-parallel-size must be >= 1, got " + std::to_string(flags.pipeline_parallel_size));
  o.pp_size = flags.pipeline_parallel_size;
  if (o.pp_micro_batches < 0)
    return invalid_argument("--pp-micro-batches must be >= 0 (0: one a stage, 1: none), got " +
                            std::to_string(o.pp_micro_batches));

  o.dp_attention = flags.enable_dp_attention;
  if (o.dp_attention && flags.data_parallel_size != 1 && flags.data_parallel_size != o.tp_size)
    return invalid_argument("--dp-size " + std::to_string(flags.data_parallel_size) + " with --enable-dp-attention: " +
                            "attention runs whole on each of the --tp-size " + std::to_string(o.tp_size) +
                            " ranks, so --dp-size is --tp-size (attention TP inside a DP rank is not built yet)");
  if (!o.dp_attention && flags.data_parallel_size != 1)
    return invalid_argument("--data-parallel-size " + std::to_string(flags.data_parallel_size) +
                            ": run one moonrun per replica behind a load balancer (or --enable-dp-attention "
                            "with --dp-size equal to --tp-size)");
  MR_RETURN_IF_ERROR(resolve_speculative_flags(flags, o.speculative));
  if (o.tp_size < 1 || o.ep_size < 1 || o.nnodes < 1) return invalid_argument("--tp-size, --ep-size and --nnodes must be >= 1");
  if (o.max_queued_requests < 0) return invalid_argument("--max-queued-requests must be >= 0");
  // Values moonrun accepts but does not act on yet: named with the others.
  for (auto& [opt, name] : flags.ignored)
    if (opt->count() > 0) {
      std::string shown = name;
      if (opt->get_expected_min() > 0 && !opt->results().empty()) shown += " " + opt->results().back();
      o.no_effect_flags.push_back(shown);
    }
  if (o.dtype == "float" || o.dtype == "fp32") o.dtype = "float32";
  if (o.kv_cache_dtype == "fp32") o.kv_cache_dtype = "float32";
  std::string cmdline;
  for (const auto& a : argv) {
    const bool plain = !a.empty() && a.find_first_of(" '\"\\$`") == std::string::npos;
    cmdline += (cmdline.empty() ? "" : " ") + (plain ? a : "'" + a + "'");
  }
  o.command_line = cmdline;
  return Status::ok();
}

std::string no_effect_warning(const server::ServeOptions& opt) {
  if (opt.no_effect_flags.empty()) return "";
  std::string s = "These flags have no effect in moonrun and were ignored: ";
  for (size_t i = 0; i < opt.no_effect_flags.size(); ++i) s += (i ? ", " : "") + opt.no_effect_flags[i];
  return s + " (`moonrun serve --help` says why for each).";
}

std::string describe_serve_options(const server::ServeOptions& o, bool one_line) {
  std::vector<std::pair<std::string, std::string>> kv;
  auto add = [&](const char* k, const std::string& v) { kv.emplace_back(k, v); };
  auto num = [](double v) {
    char b[32];
    std::snprintf(b, sizeof b, "%g", v);
    return std::string(b);
  };
  auto list = [](const std::vector<std::string>& v) {
    std::string s;
    for (const auto& x : v) s += (s.empty() ? "" : ",") + x;
    return s.empty() ? std::string("(none)") : s;
  };
  add("model_path", o.model_path.empty() ? "(demo model)" : o.model_path);
  add("served_model_name", o.served_model_name.empty() ? "(the model path)" : o.served_model_name);
  if (!o.served_model_aliases.empty()) add("served_model_aliases", list(o.served_model_aliases));
  add("device", o.device);
  add("dtype", o.dtype);
  add("kv_cache_dtype", o.kv_cache_dtype);
  add("index_cache_dtype", o.index_cache_dtype);
  add("host", o.host);
  add("port", std::to_string(o.port));
  add("api_keys", std::to_string(o.api_keys.size()) + (o.api_keys.empty() ? " (no auth)" : " (values hidden)"));
  add("protect_metrics", o.protect_metrics ? "true" : "false");
  add("web_ui", o.disable_web_ui ? "off" : "on (GET / and /chat)");
  add("allowed_origins", list(o.allowed_origins));
  add("context_length", o.context_length > 0 ? std::to_string(o.context_length) : "(the model's)");
  add("mem_fraction_static", o.mem_fraction_static > 0 ? num(o.mem_fraction_static) : "(auto)");
  add("max_running_requests", o.max_running_requests > 0 ? std::to_string(o.max_running_requests) : "(auto)");
  add("chunked_prefill_size", std::to_string(o.chunked_prefill_size));
  add("max_prefill_step_ms", o.max_prefill_step_ms > 0 ? num(o.max_prefill_step_ms) : "off");
  add("prefill_lane_min_tokens", o.prefill_lane_min_tokens > 0 ? std::to_string(o.prefill_lane_min_tokens) : "off");
  if (o.prefill_lane_min_tokens > 0)
    add("prefill_lane_step_ms", o.prefill_lane_step_ms > 0 ? num(o.prefill_lane_step_ms) : "off");
  add("max_prefill_attention_pairs",
      o.max_prefill_attention_pairs > 0 ? std::to_string(o.max_prefill_attention_pairs) : "off");
  add("max_queued_requests", std::to_string(o.max_queued_requests));
  add("page_size", std::to_string(o.page_size_tokens));
  add("prefix_cache", o.disable_radix_cache ? "off" : o.dp_attention ? "off (--enable-dp-attention)" : "on");
  add("speculative", o.speculative.enabled() ? std::string(spec_method_name(o.speculative.method)) + ", " +
                                                   std::to_string(o.speculative.num_speculative_tokens) + " drafts"
                                             : "off");
  add("cuda_graph", o.disable_cuda_graph ? "off" : o.dp_attention ? "off (--enable-dp-attention)" : "on (CUDA backend)");
  add("reasoning_parser", o.reasoning_parser.empty() ? "(from the model)" : o.reasoning_parser);
  add("tool_call_parser", o.tool_call_parser.empty() ? "(from the model)" : o.tool_call_parser);
  add("tp_size", std::to_string(o.tp_size));
  add("ep_size", std::to_string(o.ep_size));
  add("pp_size", std::to_string(o.pp_size));
  if (o.pp_size > 1) add("pp_micro_batches", o.pp_micro_batches == 0 ? "one a stage" : std::to_string(o.pp_micro_batches));
  if (o.split_latent_moe) add("split_latent_moe", o.split_latent_up ? "down and up" : "down");
  if (o.split_router) add("split_router", "true");
  if (o.dp_attention) add("enable_dp_attention", "true (dp_size " + std::to_string(o.tp_size) + ")");
  add("nnodes", std::to_string(o.nnodes));
  add("node_rank", std::to_string(o.node_rank));
  add("dist_init_addr", o.dist_init_addr.empty() ? "(none)" : o.dist_init_addr);
  add("dist_timeout", o.dist_timeout_s > 0 ? num(o.dist_timeout_s) + " s" : "(default)");
  add("max_request_bytes", std::to_string(o.max_request_bytes));
  add("max_connections", std::to_string(o.max_connections));
  add("backlog", std::to_string(o.backlog));
  add("http_timeouts", "idle " + num(o.idle_timeout_s) + " s, header " + num(o.header_timeout_s) + " s, body " +
                           num(o.body_timeout_s) + " s, write " + num(o.write_timeout_s) + " s");
  add("http_threads", o.http_threads > 0 ? std::to_string(o.http_threads) : "(running + queued + 64)");
  add("shutdown_timeout", num(o.shutdown_timeout_s) + " s");
  add("log_level", o.log_level);
  add("log_format", o.log_format);
  add("log_requests", o.log_requests ? "true" : "false");
  std::string out;
  for (const auto& [k, v] : kv) {
    if (one_line) out += (out.empty() ? "" : ", ") + k + "=" + v;
    else out += k + ": " + v + "\n";
  }
  return out;
}

std::vector<std::string> model_names(const server::ServeOptions& o, const std::string& served_name) {
  std::vector<std::string> names;
  auto add = [&](std::string n) {
    if (!n.empty() && std::find(names.begin(), names.end(), n) == names.end()) names.push_back(std::move(n));
  };
  add(served_name);
  for (const auto& a : o.served_model_aliases) add(a);
  // vLLM and SGLang serve a model under its path unless --served-model-name names it;
  // moonrun answers to both. The demo model, served when no model is given, stands in for
  // the checkpoint the guides name, so that repo id is its path here.
  std::string p = o.model_path.empty() ? std::string(kDemoModelStandsFor) : o.model_path;
  add(p);
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  add(p);
  add(p.substr(p.find_last_of('/') == std::string::npos ? 0 : p.find_last_of('/') + 1));
  return names;
}

std::vector<std::string> process_arguments() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  std::vector<std::string> args;
  std::string arg;
  while (std::getline(in, arg, '\0')) args.push_back(arg);
  return args;
}

}  // namespace moonrun::cli
