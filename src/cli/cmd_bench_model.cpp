// `moonrun bench-model --model DIR [--batch 1,8,32] [--context N] [--steps N] [--prefill N]
// [--max-total-tokens N] [--device cuda] [--dtype ...] [--tp-size N [--ep-size M] [--standin-collective-us U]] [--disable-cuda-graph] [--no-profile]
// [--kernels [--kernel-peers FILE]]
// [--json-out FILE]`: decode
// step times per batch size beside the bandwidth floor, the prefill rate beside the GEMM peak,
// and per-op tables, through the runner alone (tools/bench_model.h).
#include <cstdio>
#include <fstream>
#include <sstream>

#include "cli/commands.h"
#include "tools/bench_model.h"

namespace moonrun::cli {

void add_bench_model_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("bench-model", "Time a model's decode steps per batch size and its prefill on one device (or a TP/EP group)");
  auto c = std::make_shared<tools::ModelBenchConfig>();
  auto batches = std::make_shared<std::string>("1,8,32");
  auto json_out = std::make_shared<std::string>();
  auto no_graphs = std::make_shared<bool>(false);
  cmd->add_option("--model", c->model, "checkpoint directory or Hugging Face repo id")->required();
  cmd->add_option("--batch", *batches, "decode batch sizes, comma-separated")->capture_default_str();
  cmd->add_option("--context", c->context_tokens, "tokens in each sequence's caches before decoding")
      ->capture_default_str();
  cmd->add_option("--steps", c->decode_steps, "timed decode steps per batch size")->capture_default_str();
  cmd->add_option("--warmup", c->warmup_steps, "untimed decode steps first (graph capture)")->capture_default_str();
  cmd->add_option("--prefill", c->prefill_tokens, "also time one prompt of this many tokens (0: no)")
      ->capture_default_str();
  cmd->add_option("--chunked-prefill-size", c->runtime.max_tokens_per_step,
                  "tokens a prefill step takes (prompts go through in chunks of this many, as in serve)")
      ->capture_default_str();
  cmd->add_option("--context-length", c->runtime.context_length,
                  "the longest sequence the cache pools are sized for (0: the model's)");
  cmd->add_option("--max-total-tokens", c->runtime.max_total_tokens,
                  "cap the KV pool at this many tokens (0: what the largest row needs, within the memory); rows "
                  "that do not fit are skipped");
  cmd->add_option("--device", c->runtime.device, "cuda | cpu | auto")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}))
      ->capture_default_str();
  cmd->add_option("--dtype", c->runtime.dtype, "auto | bfloat16 | float32")->capture_default_str();
  cmd->add_option("--kv-cache-dtype", c->runtime.kv_cache_dtype, "auto (the compute dtype) | fp8 | fp8_e4m3")
      ->check(CLI::IsMember({"auto", "bf16", "bfloat16", "float32", "fp8", "fp8_e4m3"}))
      ->capture_default_str();
  cmd->add_option("--index-cache-dtype", c->runtime.index_cache_dtype, "K3.1's indexer keys: auto | fp8 | float32")
      ->check(CLI::IsMember({"auto", "fp8", "fp8_e4m3", "float32", "fp32"}))
      ->capture_default_str();
  cmd->add_option("--mem-fraction-static", c->runtime.mem_fraction_static, "GPU memory fraction (0: default)");
  cmd->add_option("--tp-size,--tensor-parallel-size,--tp", c->runtime.tp_size,
                  "ranks in this process, one GPU each (CPU: threads); > 1 also times the group's collectives")
      ->capture_default_str();
  cmd->add_option("--ep-size,--expert-parallel-size,--ep", c->runtime.ep_size,
                  "expert-parallel groups (must divide --tp-size)")
      ->capture_default_str();
  cmd->add_flag("--split-router", c->runtime.split_router, "the MoE router split over the TP ranks by expert");
  cmd->add_flag_callback(
      "--split-latent-moe", [c] { c->runtime.split_latent_moe = c->runtime.split_latent_up = true; },
      "the LatentMoE down and up projections split over the TP ranks");
  cmd->add_flag_callback(
      "--split-latent-moe-down", [c] { c->runtime.split_latent_moe = true; },
      "only the LatentMoE down projection split over the TP ranks");
  cmd->add_option("--standin-collective-us", c->runtime.standin_collective_us,
                  "with --tp-size N: time rank 0 of the group alone on one device (its shard of every kernel), each "
                  "collective a wait of this many microseconds (timing only; issue #41)")
      ->check(CLI::Range(0.0, 1e6));
  cmd->add_flag("--disable-cuda-graph", *no_graphs, "decode steps eagerly");
  auto no_profile = std::make_shared<bool>(false);
  cmd->add_flag("--no-profile", *no_profile, "skip the per-op tables (extra eager steps timed op by op)");
  cmd->add_option("--profile-steps", c->profile_steps, "profiled decode steps per batch size")->capture_default_str();
  cmd->add_flag("--kernels", c->kernels,
                "also time the K3-width kernels against their peers (routed experts, KDA decode and chunked; GPU)");
  cmd->add_option("--kernel-peers", c->kernel_peers_json,
                  "JSON from bench/peers/torch_expert_gemm.py, measured in the same run");
  cmd->add_option("--json-out", *json_out, "also write the figures as JSON here");
  cmd->add_option("--lane-chunk", c->lane_chunk_tokens,
                  "also time decode steps while a prefill-lane chunk of this many tokens (after --context tokens of "
                  "its prompt) runs beside them, against each alone (issue #47)")
      ->check(CLI::Range(0, 1 << 24));
  cmd->add_option("--lane-chunks", c->lane_chunks, "timed lane chunks per batch size")
      ->capture_default_str()->check(CLI::Range(1, 1000));
  auto drafts = std::make_shared<std::string>();
  cmd->add_option("--draft-tokens", *drafts,
                  "also time speculative verify steps of 1 + k tokens a sequence, for each k (comma-separated)");
  cmd->callback([c, batches, json_out, no_graphs, no_profile, drafts] {
    tools::ModelBenchConfig config = *c;
    config.profile = !*no_profile;
    config.commit = kMoonrunCommit;
    config.runtime.cuda_graphs = !*no_graphs;
    config.batches.clear();
    std::stringstream ss(*batches);
    for (std::string item; std::getline(ss, item, ',');) {
      try {
        config.batches.push_back(std::stoi(item));
      } catch (...) {
        std::fprintf(stderr, "moonrun bench-model: --batch: \"%s\" is not a number\n", item.c_str());
        throw CLI::RuntimeError(2);
      }
    }
    std::stringstream ds(*drafts);
    for (std::string item; std::getline(ds, item, ',');) {
      try {
        config.draft_tokens.push_back(std::stoi(item));
      } catch (...) {
        std::fprintf(stderr, "moonrun bench-model: --draft-tokens: \"%s\" is not a number\n", item.c_str());
        throw CLI::RuntimeError(2);
      }
    }
    auto report = tools::run_model_bench(config);
    if (!report.is_ok()) {
      std::fprintf(stderr, "moonrun bench-model: %s\n", report.status().message().c_str());
      throw CLI::RuntimeError(report.status().code() == StatusCode::kInvalidArgument ? 2 : 1);
    }
    // Rows that do not fit the pools were skipped (the table says so too); the rest ran.
    for (const tools::SkippedRow& r : report->skipped) std::fprintf(stderr, "moonrun bench-model: %s\n", r.message.c_str());
    std::printf("%s", tools::format_model_bench(*report).c_str());
    if (!json_out->empty()) std::ofstream(*json_out) << tools::model_bench_to_json(*report).dump(2) << "\n";
  });
}

}  // namespace moonrun::cli
