// `moonrun serve`: load a checkpoint (or the embedded demo model), size the cache pools,
// start the engine loop and the OpenAI-compatible HTTP server. The startup log shows the
// stages the seeds' users watch: tokenizer, distributed init, weights (time, memory
// before/after), pools, the limits the server will accept, ready.
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

#include "chat/render_chat.h"
#include "cli/serve_flags.h"
#include "chat/tokenizer.h"
#include "cli/commands.h"
#include "common/log.h"
#include "engine/detokenize.h"
#include "engine/engine_loop.h"
#include "model/checkpoint.h"
#include "model/kimi_k3.h"
#include "runtime/cpu_model_runner.h"
#if MOONRUN_HAS_CUDA
#include "kernels/cuda/common/device_info.h"
#include "runtime/cuda/cuda_model_runner.h"
#endif
#include "server/http_server.h"
#include "server/serve_options.h"

namespace moonrun::cli {
namespace {

std::atomic<int> g_signal{0};
void on_signal(int sig) { g_signal = sig; }

// MemAvailable from /proc/meminfo: the CPU backend's "device memory".
double available_memory_gb() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  long long kb = 0;
  std::string unit;
  while (in >> key >> kb >> unit)
    if (key == "MemAvailable:") return kb / 1024.0 / 1024.0;
  return 0;
}

std::string fmt2(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", v);
  return buf;
}

std::string exe_dir() {
  std::error_code ec;
  auto p = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string(".") : p.parent_path().string();
}

// The demo model: next to the binary when the build made it, else generated on first run
// into the user's cache (a few seconds; deterministic, so every run serves the same model).
Result<std::string> default_model_dir() {
  std::string dir = exe_dir() + "/demo-model";
  if (std::filesystem::exists(dir + "/config.json")) return dir;
  std::string cache;
  if (const char* c = std::getenv("MOONRUN_CACHE_DIR"); c && *c) cache = c;
  else if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) cache = std::string(x) + "/moonrun";
  else if (const char* h = std::getenv("HOME"); h && *h) cache = std::string(h) + "/.cache/moonrun";
  else cache = "/tmp/moonrun-cache-" + std::to_string(getuid());
  dir = cache + "/demo-model-" + kMoonrunVersion;
  if (std::filesystem::exists(dir + "/config.json")) return dir;
  MR_LOG(INFO) << "No --model-path and no demo model next to the binary: generating it once into " << dir;
  std::error_code ec;
  std::filesystem::create_directories(cache, ec);
  // Written aside and renamed, so a second server starting at the same time never reads a
  // half-written checkpoint.
  const std::string tmp = dir + ".tmp-" + std::to_string(getpid());
  Status st = write_demo_checkpoint(tmp);
  if (!st.is_ok()) return not_found("the demo model could not be generated in " + tmp + ": " + st.message());
  std::filesystem::rename(tmp, dir, ec);
  if (ec) {
    std::filesystem::remove_all(tmp, ec);
    if (!std::filesystem::exists(dir + "/config.json"))
      return not_found("the demo model could not be moved into " + dir);
  }
  return dir;
}

// The context length the server promises: --context-length, else the model's.
int64_t context_length(const server::ServeOptions& opt, const ModelConfig& cfg) {
  int64_t context_len = opt.context_length > 0 ? opt.context_length : cfg.max_position_embeddings;
  if (context_len <= 0) context_len = 4096;
  if (opt.context_length > 0 && cfg.max_position_embeddings > 0 && opt.context_length > cfg.max_position_embeddings)
    MR_LOG(WARNING) << "--context-length " << opt.context_length << " is above the model's max_position_embeddings "
                    << cfg.max_position_embeddings;
  return context_len;
}

// The engine settings both backends take from the flags.
EngineOptions engine_options(const server::ServeOptions& opt, const ModelConfig& cfg,
                                const std::shared_ptr<const chat::Tokenizer>& tok) {
  EngineOptions eopt;
  eopt.max_running_requests = opt.max_running_requests > 0 ? opt.max_running_requests : 64;
  eopt.chunked_prefill_size = opt.chunked_prefill_size;
  eopt.max_queued_requests = opt.max_queued_requests;
  eopt.context_length = static_cast<int>(std::min<int64_t>(context_length(opt, cfg), INT32_MAX));
  eopt.page_size_tokens = opt.page_size_tokens;
  eopt.fail_after_steps = opt.debug_fail_after_steps;
  eopt.is_special_token = [tok](int32_t id) { return id >= 0 && tok->is_special(static_cast<uint32_t>(id)); };
  return eopt;
}

// The CPU backend: float32 weights in RAM; the cache budget is a fraction of available RAM.
Result<std::unique_ptr<EngineLoop>> build_cpu_engine(const server::ServeOptions& opt, const std::string& dir,
                                                     const std::shared_ptr<const chat::Tokenizer>& tok) {
  const double avail_before = available_memory_gb();
  MR_LOG(INFO) << "Load weight begin. avail mem=" << fmt2(avail_before) << " GB";
  auto t0 = std::chrono::steady_clock::now();
  auto model = KimiK3Model::load(dir);
  if (!model.is_ok()) return model.status();
  const ModelConfig cfg = (*model)->config();
  const double avail_after = available_memory_gb();
  MR_LOG(INFO) << "Load weight end. elapsed="
               << fmt2(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count())
               << " s, type=" << cfg.model_type << ", avail mem=" << fmt2(avail_after)
               << " GB, mem usage=" << fmt2(std::max(0.0, avail_before - avail_after)) << " GB.";

  // Limits and pools. The CPU backend's "static memory" is a fraction of available RAM
  // (default 5 %), capped at what max_running sequences of the full context would use.
  const int64_t context_len = context_length(opt, cfg);
  const int max_running = opt.max_running_requests > 0 ? opt.max_running_requests : 64;
  const CacheLayout layout = cpu_cache_layout(cfg);
  const double fraction = opt.mem_fraction_static > 0 ? opt.mem_fraction_static : 0.05;
  int64_t budget = static_cast<int64_t>(fraction * avail_after * (1ll << 30));
  const int64_t full = layout.bytes_per_token() * context_len * max_running + layout.kda_slot_bytes * max_running;
  const int64_t least = layout.kda_slot_bytes * max_running + layout.bytes_per_token() * std::max<int64_t>(context_len, opt.page_size_tokens);
  budget = std::max(std::min(budget, full), least);

  EngineOptions eopt = engine_options(opt, cfg, tok);
  eopt.cache_budget_bytes = budget;
  std::shared_ptr<const KimiK3Model> shared_model(std::move(model).value());
  auto loop = make_cpu_engine(shared_model, eopt, detokenize_with(tok));
  if (loop.is_ok()) MR_LOG(INFO) << "Memory pool end. avail mem=" << fmt2(available_memory_gb()) << " GB";
  return loop;
}

// The CUDA backend: bf16 weights (MXFP4 experts packed) in one device arena of
// --mem-fraction-static x the card; the pools get what the weights and scratch leave.
Result<std::unique_ptr<EngineLoop>> build_cuda_engine(const server::ServeOptions& opt, const std::string& dir,
                                                      const std::shared_ptr<const chat::Tokenizer>& tok) {
#if MOONRUN_HAS_CUDA
  const cuda::DeviceMemory before = cuda::device_memory(0);
  MR_LOG(INFO) << "Load weight begin. device=cuda:0 (" << before.name << "), avail mem=" << fmt2(before.free_gb)
               << " GB";
  auto t0 = std::chrono::steady_clock::now();
  WeightLoadOptions load;
  load.mxfp4_packed = true;
  auto host = MR_TRY(KimiK3Model::load(dir, load));
  const ModelConfig cfg = host->config();
  CudaDeviceOptions dev;
  dev.mem_fraction_static = opt.mem_fraction_static > 0 ? opt.mem_fraction_static : 0.88;
  dev.max_tokens_per_step = std::max(opt.chunked_prefill_size, 1);
  auto runner = MR_TRY(CudaModelRunner::create(*host, dev));
  host.reset();  // the host copy of the weights is no longer needed
  const CudaMemoryReport& m = runner->memory();
  // The arena is reserved whole, so "mem usage" is what it holds: weights plus the space the
  // pools and scratch will take.
  MR_LOG(INFO) << "Load weight end. elapsed="
               << fmt2(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count())
               << " s, type=" << cfg.model_type << ", dtype=bfloat16, weights=" << fmt2(m.weights_gb)
               << " GB, avail mem=" << fmt2(m.free_after_weights_gb) << " GB, mem usage="
               << fmt2(std::max(0.0, m.free_before_gb - m.free_after_weights_gb)) << " GB.";
  MR_LOG(INFO) << "Device arena: " << fmt2(m.arena_gb) << " GB (--mem-fraction-static " << dev.mem_fraction_static
               << " of " << fmt2(m.total_gb) << " GB), scratch reserve " << fmt2(m.scratch_reserve_gb) << " GB";
  return make_cuda_engine(std::move(runner), engine_options(opt, cfg, tok), detokenize_with(tok));
#else
  return failed_precondition("--device cuda: this build has no CUDA backend");
#endif
}

// --dry-run: the configuration this command line resolves to, on stdout, and exit 0.
int print_dry_run(const server::ServeOptions& opt, const std::string& dir, const std::string& device) {
  std::string out = "moonrun serve --dry-run: the configuration this command line resolves to\n";
  out += describe_serve_options(opt, /*one_line=*/false);
  out += "resolved_model_dir: " + dir + "\n";
  out += "backend: " + (device.rfind("error: ", 0) == 0 ? device : device) + "\n";
  std::vector<std::string> names = model_names(opt, !opt.served_model_name.empty() ? opt.served_model_name
                                                    : !opt.model_path.empty() ? opt.model_path : "moonrun-demo");
  std::string joined;
  for (const auto& n : names) joined += (joined.empty() ? "" : ", ") + n;
  out += "answers_to_model: " + joined + "\n";
  std::vector<std::string> notes;
  if (opt.tp_size != 1 || opt.ep_size != 1 || opt.nnodes != 1)
    notes.push_back("tp_size=" + std::to_string(opt.tp_size) + ", ep_size=" + std::to_string(opt.ep_size) + ", nnodes=" +
                    std::to_string(opt.nnodes) + ": the multi-GPU backend is not in this build yet, so `serve` "
                    "without --dry-run refuses this (one GPU: --tp-size 1)");
  if (device.rfind("error: ", 0) == 0) notes.push_back(device.substr(7));
  for (const auto& n : notes) out += "note: " + n + "\n";
  const std::string w = no_effect_warning(opt);
  out += "warnings: " + (w.empty() ? std::string("none") : w) + "\n";
  std::fwrite(out.data(), 1, out.size(), stdout);
  return 0;
}

// What an operator checks first in a log: which build, which flags, which hardware.
void log_startup_dump(const server::ServeOptions& opt) {
  MR_LOG(INFO) << "moonrun " << kMoonrunVersion << " (commit " << kMoonrunCommit << ", "
#if MOONRUN_HAS_CUDA
               << "CUDA build"
#else
               << "CPU-only build"
#endif
               << ")";
  MR_LOG(INFO) << "command line: " << opt.command_line;
#if MOONRUN_HAS_CUDA
  const int n = cuda::device_count();
  if (n == 0) MR_LOG(INFO) << "GPU: none visible";
  for (int i = 0; i < n; ++i) {
    const cuda::DeviceMemory m = cuda::device_memory(i);
    MR_LOG(INFO) << "GPU " << i << ": " << m.name << ", " << fmt2(m.total_gb) << " GiB";
  }
#else
  MR_LOG(INFO) << "GPU: none (this build has no CUDA backend)";
#endif
  MR_LOG(INFO) << "server_args: " << describe_serve_options(opt, /*one_line=*/true);
  const std::string w = no_effect_warning(opt);
  if (!w.empty()) MR_LOG(WARNING) << w;
}

int run_serve(server::ServeOptions opt) {
  LogLevel level = LogLevel::INFO;
  parse_log_level(opt.log_level, level);
  set_log_level(level);
  set_log_format(opt.log_format == "json" ? LogFormat::kJson : LogFormat::kText);
  log_startup_dump(opt);

  std::string model_ref = opt.model_path;
  if (model_ref.empty()) {
    auto d = default_model_dir();
    if (!d.is_ok()) {
      std::fprintf(stderr, "moonrun serve: %s\n", d.status().message().c_str());
      return 2;
    }
    model_ref = *d;
    MR_LOG(INFO) << "No --model-path: serving the embedded demo model (random weights) from " << model_ref;
  }
  auto dir = resolve_model_path(model_ref);
  if (!dir.is_ok()) {
    std::fprintf(stderr, "moonrun serve: %s\n", dir.status().message().c_str());
    return 2;
  }
  const std::string device = resolve_device(opt.device);
  if (opt.dry_run) return print_dry_run(opt, *dir, device);
  if (device.rfind("error: ", 0) == 0) {
    std::fprintf(stderr, "moonrun serve: %s\n", device.substr(7).c_str());
    return 2;
  }
  if (opt.tp_size != 1 || opt.ep_size != 1 || opt.nnodes != 1) {
    std::fprintf(stderr, "moonrun serve: --tp-size/--ep-size/--nnodes > 1 need the multi-GPU backend, which is not in this build yet\n");
    return 2;
  }
  if (opt.node_rank < 0 || opt.node_rank >= opt.nnodes) {
    std::fprintf(stderr, "moonrun serve: --node-rank %d is outside [0, %d)\n", opt.node_rank, opt.nnodes);
    return 2;
  }

  // Tokenizer and chat format.
  auto tokenizer = chat::Tokenizer::load(*dir);
  if (!tokenizer.is_ok()) {
    std::fprintf(stderr, "moonrun serve: %s\n", tokenizer.status().message().c_str());
    return 2;
  }
  auto tok = std::make_shared<const chat::Tokenizer>(std::move(tokenizer).value());
  {
    // The seed's first line: "#words: 163840 - BOS ID: 163584 - EOS ID: 163585".
    auto id = [&](const char* name) {
      auto v = tok->special_id(name);
      return v ? std::to_string(*v) : std::string("none");
    };
    MR_LOG(INFO) << "#words: " << tok->vocab_size() << " - BOS ID: " << id("[BOS]") << " - EOS ID: "
                 << id("[EOS]") << " - end of message: " << id("<|end_of_msg|>");
  }
  auto format = chat::chat_format_for_checkpoint(*dir);
  if (!opt.reasoning_parser.empty() || !opt.tool_call_parser.empty()) {
    const std::string& name = !opt.tool_call_parser.empty() ? opt.tool_call_parser : opt.reasoning_parser;
    format = chat::chat_format_from_name(name);
  }
  if (!format.is_ok()) {
    std::fprintf(stderr, "moonrun serve: %s\n", format.status().message().c_str());
    return 2;
  }

  // Distributed init: one CPU rank today; the multi-GPU backend replaces this stage.
  set_thread_log_tag("TP0 EP0");
  MR_LOG(INFO) << "Init distributed begin. backend=" << device << ", tp_size=1, ep_size=1, nnodes=1";
  MR_LOG(INFO) << "Init distributed ends. elapsed=0.00 s, mem usage=0.00 GB";

  auto loop = device == "cuda" ? build_cuda_engine(opt, *dir, tok) : build_cpu_engine(opt, *dir, tok);
  if (!loop.is_ok()) {
    std::fprintf(stderr, "moonrun serve: %s\n", loop.status().message().c_str());
    return 2;
  }
  Status st = (*loop)->start();
  if (!st.is_ok()) {
    std::fprintf(stderr, "moonrun serve: %s\n", st.message().c_str());
    return 1;
  }

  server::ServingContext ctx;
  ctx.options = opt;
  ctx.served_model_name = !opt.served_model_name.empty() ? opt.served_model_name
                          : !opt.model_path.empty()      ? opt.model_path
                                                         : "moonrun-demo";
  ctx.model_names = model_names(opt, ctx.served_model_name);
  server::Metrics metrics(ctx.served_model_name);
  ctx.max_model_len = (*loop)->config().max_model_len;
  ctx.created_unix_s = std::chrono::duration_cast<std::chrono::seconds>(
                           std::chrono::system_clock::now().time_since_epoch()).count();
  ctx.chat_format = *format;
  ctx.tokenizer = tok;
  ctx.engine = loop->get();
  ctx.metrics = &metrics;

  server::HttpServer http(ctx);
  st = http.bind();
  if (!st.is_ok()) {
    std::fprintf(stderr, "moonrun serve: %s\n", st.message().c_str());
    (*loop)->stop();
    return 1;
  }
  set_thread_log_tag("");
  ::signal(SIGTERM, on_signal);
  ::signal(SIGINT, on_signal);
  ::signal(SIGPIPE, SIG_IGN);

  // SIGTERM/SIGINT: stop accepting, refuse new work, let running requests go on for
  // --shutdown-timeout, then cut the rest with a proper final answer, then exit.
  std::atomic<bool> served{false};
  std::thread watcher([&] {
    while (g_signal == 0 && !served) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    if (served && g_signal == 0) return;
    MR_LOG(INFO) << "Signal " << g_signal.load() << " received: draining (new requests get 503; running ones have "
                 << opt.shutdown_timeout_s << " s)";
    (*loop)->begin_drain();
    const int cut = http.shutdown(std::chrono::duration<double>(opt.shutdown_timeout_s));
    if (cut > 0) MR_LOG(WARNING) << cut << " request(s) cut at the deadline";
  });
  MR_LOG(INFO) << "Serving " << ctx.served_model_name << " on http://" << opt.host << ":" << http.port()
               << " (OpenAI-compatible: /v1/chat/completions, /v1/completions, /v1/models)";
  MR_LOG(INFO) << "The server is fired up and ready to roll!";
  http.serve();
  served = true;
  watcher.join();
  (*loop)->stop();
  MR_LOG(INFO) << "Shutdown complete.";
  return 0;
}

}  // namespace

void add_serve_command(CLI::App& app) {
  auto flags = std::make_shared<ServeFlags>();
  auto* cmd = app.add_subcommand("serve", "Serve a model over an OpenAI-compatible HTTP API");
  add_serve_flags(cmd, flags);
  cmd->callback([flags] {
    Status st = finish_serve_flags(*flags, process_arguments());
    if (!st.is_ok()) {
      std::fprintf(stderr, "moonrun serve: %s\n", st.message().c_str());
      throw CLI::RuntimeError(2);
    }
    int rc = run_serve(flags->options);
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace moonrun::cli
