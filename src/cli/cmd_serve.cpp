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

#include <nlohmann/json.hpp>

#include "chat/render_chat.h"
#include "cli/serve_flags.h"
#include "chat/tokenizer.h"
#include "cli/commands.h"
#include "common/log.h"
#include "server/detokenize.h"
#include "engine/engine_loop.h"
#include "model/checkpoint.h"
#include "model/config.h"
#include "model/model.h"
#include "runtime/cluster.h"
#include "runtime/parallel_groups.h"
#include "runtime/runtime_builder.h"
#include "server/http_server.h"
#include "server/image_input.h"
#include "server/serve_options.h"

namespace moonrun::cli {
namespace {

// After the distributed group failed, node 0 keeps its listener open this long, answering
// /health (and every new request) with 503, before it closes it and exits non-zero: a
// health poller or load balancer then sees the failure as a 503, not only as a refused
// connection after the process is gone.
constexpr std::chrono::milliseconds kFailedGroupHealthWindow{3000};

std::atomic<int> g_signal{0};

std::string fmt2(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", v);
  return buf;
}
void on_signal(int sig) { g_signal = sig; }

std::string exe_dir() {
  std::error_code ec;
  auto p = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string(".") : p.parent_path().string();
}

// The demo model (models/moonrun-demo, trained: training/README.md): next to the binary
// where the build copies it, else in the source tree the binary was built from.
Result<std::string> default_model_dir() {
  const std::string beside = exe_dir() + "/demo-model";
  if (std::filesystem::exists(beside + "/config.json")) return beside;
#ifdef MOONRUN_DEMO_MODEL_SOURCE
  if (std::filesystem::exists(std::string(MOONRUN_DEMO_MODEL_SOURCE) + "/config.json"))
    return std::string(MOONRUN_DEMO_MODEL_SOURCE);
#endif
  return not_found("no --model-path, and the demo model is neither next to the binary (" + beside +
                   ") nor in the source tree it was built from (models/moonrun-demo): pass --model-path DIR");
}

// config.json of a checkpoint directory, parsed (for what every node must agree on).
Result<ModelConfig> read_model_config(const std::string& dir) {
  std::ifstream in(dir + "/config.json");
  if (!in) return not_found(dir + "/config.json: cannot be read");
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
  if (j.is_discarded()) return invalid_argument(dir + "/config.json: not valid JSON");
  return parse_model_config(j, dir + "/config.json");
}

// The runtime settings the serve flags ask for.
// What chat requests' images need (server/image_input.h): null when the checkpoint has no
// vision tower, or when the model is split over ranks (the tower runs on one rank only
// today); image parts are then 400s that say so.
Result<std::shared_ptr<const server::ImageInputConfig>> image_input_config(const server::ServeOptions& opt,
                                                                           const std::string& dir) {
  const ModelConfig cfg = MR_TRY(read_model_config(dir));
  if (!cfg.vision.enabled) return std::shared_ptr<const server::ImageInputConfig>();
  if (opt.tp_size * opt.nnodes > 1) {
    MR_LOG(WARNING) << "The model has a vision tower, but images are not served at --tp-size " << opt.tp_size
                    << " x --nnodes " << opt.nnodes << " yet (the tower runs on a single rank): image inputs get 400";
    return std::shared_ptr<const server::ImageInputConfig>();
  }
  auto c = std::make_shared<server::ImageInputConfig>(MR_TRY(server::image_input_config(dir, cfg)));
  c->limits.allow_urls = opt.allow_image_urls;
  c->limits.max_pixels = opt.max_image_pixels;
  c->limits.max_bytes = opt.max_image_bytes;
  c->limits.max_images = opt.max_images_per_request;
  c->limits.max_patches = Model::max_image_patches(std::max(opt.chunked_prefill_size, 1));
  return std::shared_ptr<const server::ImageInputConfig>(std::move(c));
}

RuntimeOptions runtime_options(const server::ServeOptions& opt) {
  RuntimeOptions ro;
  ro.device = opt.device;
  ro.dtype = opt.dtype;
  ro.kv_cache_dtype = opt.kv_cache_dtype;
  ro.index_cache_dtype = opt.index_cache_dtype;
  ro.mem_fraction_static = opt.mem_fraction_static;
  ro.max_running_requests = opt.max_running_requests > 0 ? opt.max_running_requests : defaults::kMaxRunningRequests;
  ro.max_tokens_per_step = std::max(opt.chunked_prefill_size, 1);
  if (opt.prefill_lane_min_tokens > 0) {
    // The lane takes long prompts' chunks whole (--chunked-prefill-size); the shared steps,
    // left with decodes and short prompts, a quarter of it, so that both steps' scratch fit
    // where one step's did (1.25x: on the K3-width slice a step of 8,192 tokens needs ~23 GB).
    ro.prefill_lane_tokens = ro.max_tokens_per_step;
    ro.max_tokens_per_step = std::max({ro.max_tokens_per_step / 4, ro.max_running_requests, 1});
  }
  ro.page_size_tokens = opt.page_size_tokens;
  ro.context_length = opt.context_length;
  ro.prefix_cache = !opt.disable_radix_cache;
  ro.cuda_graphs = !opt.disable_cuda_graph;
  ro.fail_after_steps = opt.debug_fail_after_steps;
  ro.tp_size = opt.tp_size;
  ro.ep_size = opt.ep_size;
  ro.pp_size = opt.pp_size;
  ro.pp_micro_batches = opt.pp_micro_batches;
  ro.split_router = opt.split_router;
  ro.split_latent_moe = opt.split_latent_moe;
  ro.split_latent_up = opt.split_latent_up;
  ro.dp_attention = opt.dp_attention;
  ro.num_speculative_tokens = opt.speculative.enabled() ? opt.speculative.num_speculative_tokens : 0;
  if (opt.speculative.enabled() && opt.speculative.method == SpecMethod::kDSpark)
    ro.draft_model = opt.speculative.draft_model;
  return ro;
}

// The multi-node settings (--nnodes, --node-rank, --dist-init-addr, --dist-timeout) and what
// every node must agree on.
ClusterOptions cluster_options(const server::ServeOptions& opt, const std::string& device, const ModelConfig& cfg) {
  ClusterOptions co;
  co.nnodes = opt.nnodes;
  co.node_rank = opt.node_rank;
  co.dist_init_addr = opt.dist_init_addr;
  co.timeout_s = opt.dist_timeout_s > 0 ? opt.dist_timeout_s : defaults::kDistTimeoutSeconds;
  const nlohmann::json fp = {{"moonrun", kMoonrunVersion},
                             {"model", {cfg.model_type, cfg.hidden_size, cfg.num_hidden_layers, cfg.vocab_size, cfg.num_experts}},
                             {"tp", opt.tp_size},
                             {"ep", opt.ep_size},
                             {"pp", opt.pp_size},
                             {"split", {opt.split_router, opt.split_latent_moe, opt.split_latent_up}},
                             {"dp_attention", opt.dp_attention},
                             {"nnodes", opt.nnodes},
                             {"device", device},
                             {"dtype", opt.dtype},
                             {"kv_cache_dtype", opt.kv_cache_dtype},
                             {"max_running_requests", opt.max_running_requests},
                             {"chunked_prefill_size", opt.chunked_prefill_size},
                             {"page_size", opt.page_size_tokens},
                             {"prefix_cache", !opt.disable_radix_cache},
                             {"speculative_tokens", opt.speculative.enabled() ? opt.speculative.num_speculative_tokens : 0}};
  co.fingerprint = fp.dump();
  return co;
}

// Backend, model and cache pools (runtime_builder.h; across the nodes with cluster.h when
// --nnodes > 1), then the engine on top.
Result<std::unique_ptr<EngineLoop>> build_engine(const server::ServeOptions& opt, const std::string& dir,
                                                 const std::shared_ptr<const chat::Tokenizer>& tok,
                                                 std::shared_ptr<Coordinator> coordinator,
                                                 const ClusterOptions& cluster) {
  RuntimeOptions ro = runtime_options(opt);
  Runtime rt;
  if (coordinator) {
    ro = MR_TRY(node_runtime_options(ro, cluster));
    rt = MR_TRY(build_node0_runtime(dir, ro, std::move(coordinator)));
  } else {
    rt = MR_TRY(build_runtime(dir, ro));
  }
  const ModelConfig& cfg = rt.config;
  if (opt.context_length > 0 && cfg.max_position_embeddings > 0 && opt.context_length > cfg.max_position_embeddings)
    MR_LOG(WARNING) << "--context-length " << opt.context_length << " is above the model's max_position_embeddings "
                    << cfg.max_position_embeddings;

  EngineConfig ec;
  ec.scheduler.max_running_requests = ro.max_running_requests;
  ec.scheduler.max_tokens_per_step = opt.prefill_lane_min_tokens > 0 ? ro.max_tokens_per_step : opt.chunked_prefill_size;
  ec.scheduler.max_prefill_attention_pairs = opt.max_prefill_attention_pairs;
  ec.max_prefill_step_ms = opt.max_prefill_step_ms;
  ec.prefill_context_pairs = cfg.prefill_context_pairs();
  ec.prefill_lane_min_tokens = opt.prefill_lane_min_tokens;
  ec.prefill_lane_chunk_tokens = ro.prefill_lane_tokens;
  ec.prefill_lane_step_ms = opt.prefill_lane_step_ms;
  ec.scheduler.max_queued_requests = opt.max_queued_requests;
  ec.max_model_len = static_cast<int>(std::min<int64_t>(opt.context_length, INT32_MAX));
  if (cfg.eos_token_id >= 0) ec.eos_token_ids.push_back(cfg.eos_token_id);
  ec.is_special_token = [tok](int32_t id) { return id >= 0 && tok->is_special(static_cast<uint32_t>(id)); };
  ec.speculative = opt.speculative;
  ec.pad_drafts = rt.device == "cuda" && ro.cuda_graphs;  // uniform verify steps replay graphs
  ec.auto_stand_aside = rt.device == "cuda";               // measured steps decide (spec_balance.h)
  const int64_t model_len = cfg.max_position_embeddings > 0 ? cfg.max_position_embeddings : 4096;
  ec = MR_TRY(resolve_engine_config(ec, model_len, rt.cache));
  if (opt.context_length <= 0 && ec.max_model_len < model_len)
    MR_LOG(WARNING) << "The context length is capped at the KV pool: " << ec.max_model_len << " tokens (the model's is "
                    << model_len << "); raise --mem-fraction-static for more";
  MR_LOG(INFO) << "max_total_num_tokens=" << rt.cache.total_tokens()
               << ", chunked_prefill_size=" << opt.chunked_prefill_size
               << ", max_running_requests=" << ro.max_running_requests << ", context_len=" << ec.max_model_len
               << ", prefix_cache=" << (rt.cache.prefix_block_tokens > 0 ? "on" : "off")
               << ", cuda_graph=" << (rt.device == "cuda" && ro.cuda_graphs ? "on" : "off") << ", speculative="
               << (opt.speculative.enabled() ? std::string(spec_method_name(opt.speculative.method)) + " k=" +
                                                   std::to_string(opt.speculative.num_speculative_tokens)
                                             : std::string("off"));
  auto cache = std::make_unique<CacheManager>(rt.cache);
  return EngineLoop::create(ec, std::move(cache), std::move(rt.runner), detokenize_with(tok));
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
  if (opt.nnodes > 1 && opt.dist_init_addr.empty())
    notes.push_back("--nnodes " + std::to_string(opt.nnodes) + " needs --dist-init-addr HOST:PORT (node 0's address)");
  if (opt.nnodes > 1 && opt.tp_size % opt.nnodes != 0)
    notes.push_back("--tp-size " + std::to_string(opt.tp_size) + " does not split over --nnodes " +
                    std::to_string(opt.nnodes) + ": every node runs the same number of ranks");
  if (device.rfind("error: ", 0) == 0) notes.push_back(device.substr(7));
  // What the runtime will refuse at a real start (never accepted and silently ignored).
  if (opt.kv_cache_dtype == "fp8_e5m2")
    notes.push_back("--kv-cache-dtype fp8_e5m2: moonrun's fp8 MLA cache is e4m3, so `serve` without --dry-run "
                    "refuses this (use --kv-cache-dtype fp8)");
  if (opt.dtype == "half" || opt.dtype == "float16")
    notes.push_back("--dtype " + opt.dtype + ": moonrun computes in bf16 (GPU) or fp32 (CPU), so `serve` without "
                    "--dry-run refuses this (use --dtype auto)");
  for (const auto& n : notes) out += "note: " + n + "\n";
  const std::string w = no_effect_warning(opt);
  out += "warnings: " + (w.empty() ? std::string("none") : w) + "\n";
  std::fwrite(out.data(), 1, out.size(), stdout);
  return 0;
}

// What an operator checks first in a log: which build, which flags, which hardware.
void log_startup_dump(const server::ServeOptions& opt) {
  MR_LOG(INFO) << "moonrun " << kMoonrunVersion << " (commit " << kMoonrunCommit << ", "
               << (has_cuda_backend() ? "CUDA build" : "CPU-only build") << ")";
  MR_LOG(INFO) << "command line: " << opt.command_line;
  const std::vector<GpuDescription> gpus = visible_gpus();
  if (!has_cuda_backend()) MR_LOG(INFO) << "GPU: none (this build has no CUDA backend)";
  else if (gpus.empty()) MR_LOG(INFO) << "GPU: none visible";
  for (size_t i = 0; i < gpus.size(); ++i)
    MR_LOG(INFO) << "GPU " << i << ": " << gpus[i].name << ", " << fmt2(gpus[i].total_gib) << " GiB";
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
    MR_LOG(INFO) << "No --model-path: serving the demo model (models/moonrun-demo, docs/demo-model.md) from " << model_ref;
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
  opt.device = device;
  if (opt.node_rank < 0 || opt.node_rank >= opt.nnodes) {
    std::fprintf(stderr, "moonrun serve: --node-rank %d is outside [0, %d)\n", opt.node_rank, opt.nnodes);
    return 2;
  }
  ClusterOptions cluster;
  if (opt.nnodes > 1) {
    if (opt.dist_init_addr.empty()) {
      std::fprintf(stderr, "moonrun serve: --nnodes %d needs --dist-init-addr HOST:PORT (node 0's address)\n",
                   opt.nnodes);
      return 2;
    }
    auto cfg = read_model_config(*dir);
    if (!cfg.is_ok()) {
      std::fprintf(stderr, "moonrun serve: %s\n", cfg.status().message().c_str());
      return 2;
    }
    cluster = cluster_options(opt, device, *cfg);
    if (device == "cuda" && opt.node_rank == 0) {
      auto id = make_nccl_id_hex();
      if (!id.is_ok()) {
        std::fprintf(stderr, "moonrun serve: %s\n", id.status().message().c_str());
        return 2;
      }
      cluster.nccl_id_hex = *id;
      // Stages across nodes: an id for every group (each stage's TP group, each ring link),
      // each process making its members (runtime/parallel_groups.h).
      for (int g = 0; opt.pp_size > 1 && g < num_parallel_groups(opt.tp_size, opt.pp_size); ++g) {
        auto gid = make_nccl_id_hex();
        if (!gid.is_ok()) {
          std::fprintf(stderr, "moonrun serve: %s\n", gid.status().message().c_str());
          return 2;
        }
        cluster.nccl_group_ids_hex.push_back(*gid);
      }
    }
    auto ro = node_runtime_options(runtime_options(opt), cluster);
    if (!ro.is_ok()) {
      std::fprintf(stderr, "moonrun serve: %s\n", ro.status().message().c_str());
      return 2;
    }
    // Every node but 0 runs its ranks' share of each step; node 0 serves HTTP.
    if (opt.node_rank > 0) {
      set_thread_log_tag("node " + std::to_string(opt.node_rank));
      return run_follower_node(*dir, *ro, cluster);
    }
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

  // Distributed init: the other nodes join node 0 (multi-node), or the ranks are threads here.
  set_thread_log_tag("TP0 EP0");
  const auto dist_t0 = std::chrono::steady_clock::now();
  MR_LOG(INFO) << "Init distributed begin. backend=" << device << ", tp_size=" << opt.tp_size
               << ", ep_size=" << opt.ep_size << ", pp_size=" << opt.pp_size
               << (opt.split_latent_moe ? opt.split_latent_up ? ", split_latent_moe=down,up" : ", split_latent_moe=down" : "") << (opt.split_router ? ", split_router=true" : "")
               << (opt.dp_attention ? ", dp_attention=true" : "") << ", nnodes=" << opt.nnodes
               << (opt.nnodes > 1    ? " (one process per node, ZeroMQ control plane at " + opt.dist_init_addr + ")"
                   : opt.tp_size * opt.pp_size > 1 ? " (ranks as threads of this process, shared-memory collectives)"
                                     : "");
  std::shared_ptr<Coordinator> coordinator;
  if (opt.nnodes > 1) {
    auto c = Coordinator::start(cluster);
    if (!c.is_ok()) {
      MR_LOG(ERROR) << c.status().message();
      std::fprintf(stderr, "moonrun serve: %s\n", c.status().message().c_str());
      return 1;
    }
    coordinator = std::move(c).value();
  }
  MR_LOG(INFO) << "Init distributed ends. elapsed="
               << fmt2(std::chrono::duration<double>(std::chrono::steady_clock::now() - dist_t0).count())
               << " s, mem usage=0.00 GB";

  auto loop = build_engine(opt, *dir, tok, coordinator, cluster);
  if (!loop.is_ok()) {
    if (coordinator) coordinator->stop(true, "node 0 could not start: " + loop.status().message());
    std::fprintf(stderr, "moonrun serve: %s\n", loop.status().message().c_str());
    return coordinator ? 1 : 2;
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
  ctx.responses = std::make_shared<server::ResponseStore>();
  auto images = image_input_config(opt, *dir);
  if (!images.is_ok()) {
    std::fprintf(stderr, "moonrun serve: %s\n", images.status().message().c_str());
    return 2;
  }
  ctx.images = std::move(images).value();

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
  // A multi-node group that broke (a node gone, a failed step) ends node 0 too, non-zero:
  // its requests fail (the engine did that), /health is 503 for kFailedGroupHealthWindow,
  // and the operator's supervisor sees the exit.
  std::atomic<bool> served{false}, group_failed{false};
  auto broken = [&] { return coordinator && (coordinator->failed() || !(*loop)->alive()); };
  std::thread watcher([&] {
    while (g_signal == 0 && !served && !broken()) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    if (served && g_signal == 0) return;
    if (g_signal == 0) {
      group_failed = true;
      const std::string why = coordinator->failed() ? coordinator->failure() : std::string("a step failed");
      MR_LOG(ERROR) << "The distributed group failed (" << why << "): node 0 answers 503 for "
                    << kFailedGroupHealthWindow.count() / 1000.0 << " s, then stops serving and exits";
      coordinator->stop(true, why);
      (*loop)->begin_drain();
      http.set_draining(true);  // /health and new requests: 503
      std::this_thread::sleep_for(kFailedGroupHealthWindow);
      http.shutdown(std::chrono::duration<double>(0.5));
      return;
    }
    MR_LOG(INFO) << "Signal " << g_signal.load() << " received: draining (new requests get 503; running ones have "
                 << opt.shutdown_timeout_s << " s)";
    (*loop)->begin_drain();
    const int cut = http.shutdown(std::chrono::duration<double>(opt.shutdown_timeout_s));
    if (cut > 0) MR_LOG(WARNING) << cut << " request(s) cut at the deadline";
  });
  MR_LOG(INFO) << "Serving " << ctx.served_model_name << " on http://" << opt.host << ":" << http.port()
               << " (OpenAI-compatible: /v1/chat/completions, /v1/completions, /v1/models)";
  if (!opt.disable_web_ui)
    MR_LOG(INFO) << "Chat page: http://" << opt.host << ":" << http.port() << "/ (--disable-web-ui turns it off)";
  MR_LOG(INFO) << "The server is fired up and ready to roll!";
  http.serve();
  served = true;
  watcher.join();
  (*loop)->stop();
  if (coordinator) coordinator->stop(group_failed, group_failed ? "node 0 exits: the group failed" : "node 0 shut down");
  MR_LOG(INFO) << "Shutdown complete.";
  return group_failed ? 1 : 0;
}

}  // namespace

void add_serve_command(CLI::App& app) {
  auto flags = std::make_shared<ServeFlags>();
  auto* cmd = app.add_subcommand("serve", "Serve a model over an OpenAI-compatible HTTP API");
  add_serve_flags(cmd, flags);
  // Here rather than in serve_flags.cpp: moonrun's own flag, not one of SGLang's or vLLM's.
  cmd->add_flag("--disable-web-ui", flags->options.disable_web_ui,
                "Do not serve the built-in chat page at / and /chat (docs/chat-page.md)");
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
