// `moonrun plan`: will this model fit this cluster, and what is left for the caches?
// The arithmetic lives in tools/plan.cpp; this file is the command line, with `serve`'s
// flag names (--model-path, --tp-size, --ep-size, --nnodes, --mem-fraction-static,
// --context-length, --kv-cache-dtype and their vLLM aliases) so one launch line's values
// carry over. Exit codes: 0 fits, 1 DOES NOT FIT, 2 usage error.
#include <cstdio>

#include "cli/commands.h"
#include "tools/plan.h"

namespace moonrun::cli {

namespace {

struct PlanArgs {
  std::string model, positional;
  std::string gpu;
  int gpus_per_node = 0;  // 0: 8, or --tp-size when it is smaller
  int nodes = 0;          // 0: from --tp-size, else 1
  int tp = 0, ep = 0, pp = 1;
  bool split_latent_moe = false, split_latent_up = false, split_router = false;
  bool dp_attention = false;
  double mem_fraction = 0.85;
  int64_t context_length = 0;
  std::string kv_dtype = "auto";
  double price_per_gpu_hour = 0;
  bool json = false;
};

int run_plan(PlanArgs a) {
  if (!a.positional.empty()) {
    if (!a.model.empty() && a.model != a.positional) {
      std::fprintf(stderr, "moonrun plan: the model is given twice ('%s' and --model-path '%s')\n", a.positional.c_str(),
                   a.model.c_str());
      return 2;
    }
    a.model = a.positional;
  }
  if (a.model.empty()) {
    std::fprintf(stderr, "moonrun plan: give the model: `moonrun plan PATH --gpu H200` (kimi-k3, kimi-k3.1-pro, a config.json or a checkpoint)\n");
    return 2;
  }
  const tools::GpuSpec* gpu = tools::find_gpu(a.gpu);
  if (!gpu) {
    std::fprintf(stderr, "moonrun plan: --gpu %s is not known (known: %s)\n", a.gpu.c_str(),
                 tools::known_gpu_names().c_str());
    return 2;
  }
  // The cluster: from --nnodes x --gpus-per-node, or from --tp-size as `serve` would run it.
  // Every GPU runs one rank of one stage: tp x pp GPUs.
  const int ranks = a.tp * a.pp;
  if (a.gpus_per_node == 0) a.gpus_per_node = a.tp > 0 && a.nodes == 0 && ranks < 8 ? ranks : 8;
  if (a.nodes == 0) a.nodes = a.tp > 0 ? std::max(1, (ranks + a.gpus_per_node - 1) / a.gpus_per_node) : 1;
  auto model = tools::load_plan_model(a.model);
  if (!model) {
    std::fprintf(stderr, "moonrun plan: %s\n", model.status().message().c_str());
    return 2;
  }
  tools::PlanInputs in;
  in.shape = model->shape;
  in.weights = model->weights;
  in.gpu = *gpu;
  in.gpus_per_node = a.gpus_per_node;
  in.nodes = a.nodes;
  in.tp = a.tp;
  in.ep = a.ep;
  in.pp = a.pp;
  in.split_latent_moe = a.split_latent_moe;
  in.split_latent_up = a.split_latent_up;
  in.split_router = a.split_router;
  in.dp_attention = a.dp_attention;
  in.mem_fraction = a.mem_fraction;
  in.context_length = a.context_length;
  in.kv_dtype_bytes = a.kv_dtype.rfind("fp8", 0) == 0 ? 1 : 2;
  in.price_per_gpu_hour = a.price_per_gpu_hour;
  auto plan = tools::make_plan(in);
  if (!plan) {
    std::fprintf(stderr, "moonrun plan: %s\n", plan.status().message().c_str());
    return 2;
  }
  if (a.json)
    std::printf("%s\n", tools::plan_to_json(*plan).dump(2).c_str());
  else
    std::fputs(tools::format_plan_table(*plan).c_str(), stdout);
  return plan->fits ? 0 : 1;  // scripts can gate a deployment on it
}

}  // namespace

void add_plan_command(CLI::App& app) {
  auto args = std::make_shared<PlanArgs>();
  auto* cmd = app.add_subcommand(
      "plan", "Will a model fit a cluster: weights per GPU under TP x EP x PP (by stage and group), the collectives a decode step issues, valid TP sizes, KV/KDA cache room, cost. "
              "Exit 0 fits, 1 does not fit, 2 usage error");
  cmd->add_option("model", args->positional, "the model (same as --model-path)");
  cmd->add_option("--model-path,--model", args->model,
                  "kimi-k3 or kimi-k3.1-pro (built-in configs), a config.json, or a checkpoint directory (exact bytes from its headers)");
  cmd->add_option("--gpu", args->gpu, "H100, H200, B200, B300 or GB300 (NVL72)")->required();
  cmd->add_option("--tp-size,--tensor-parallel-size,--tp", args->tp,
                  "tensor-parallel size (default: every GPU); sets --nnodes when that is not given")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--ep-size,--expert-parallel-size,--ep", args->ep, "expert-parallel size (default: = TP)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--pp-size,--pipeline-parallel-size,--pp", args->pp,
                  "pipeline stages: TP x EP inside each, layers split so stages carry balanced bytes (default 1)")
      ->check(CLI::PositiveNumber);
  cmd->add_flag_callback(
      "--split-latent-moe", [args] { args->split_latent_moe = args->split_latent_up = true; },
      "plan the LatentMoE down and up projections split over TP instead of replicated");
  cmd->add_flag_callback(
      "--split-latent-moe-down", [args] { args->split_latent_moe = true; },
      "plan only the LatentMoE down projection split over TP (the up projection whole: its routed sum rides the "
      "shared experts' all-reduce)");
  cmd->add_flag("--split-router", args->split_router, "plan the fp32 router split over TP (by expert) instead of replicated");
  cmd->add_flag("--enable-dp-attention", args->dp_attention,
                "plan DP attention x EP (as serve's flag): attention, dense layers, shared experts, router and vocabulary "
                "whole on every rank, routed experts under EP; per MoE layer a rows gather and the experts' sum");
  cmd->add_option("--nnodes,--nodes", args->nodes, "number of nodes")->check(CLI::PositiveNumber);
  cmd->add_option("--gpus-per-node", args->gpus_per_node, "GPUs per node (default 8)")->check(CLI::PositiveNumber);
  cmd->add_option("--mem-fraction-static,--gpu-memory-utilization,--mem-fraction", args->mem_fraction,
                  "share of each GPU's usable memory for weights + caches")
      ->check(CLI::Range(0.01, 1.0))->capture_default_str();
  cmd->add_option("--context-length,--max-model-len", args->context_length,
                  "tokens per sequence for the concurrency figure (default: the model's maximum)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--kv-cache-dtype,--kv-dtype", args->kv_dtype, "KV cache dtype: auto (bf16), bf16, fp8")
      ->check(CLI::IsMember({"auto", "bf16", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2"}));
  cmd->add_option("--price-per-gpu-hour", args->price_per_gpu_hour, "USD per GPU per hour")
      ->check(CLI::NonNegativeNumber);
  cmd->add_flag("--json", args->json, "print JSON instead of the table");
  cmd->callback([args] {
    int rc = run_plan(*args);
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace moonrun::cli
