// `moonrun plan`: will this model fit this cluster, and what is left for the caches?
// The arithmetic lives in tools/plan.cpp; this file is the command line.
#include <cstdio>

#include "cli/commands.h"
#include "tools/plan.h"

namespace moonrun::cli {

namespace {

struct PlanArgs {
  std::string model;
  std::string gpu;
  int gpus_per_node = 8;
  int nodes = 1;
  double mem_fraction = 0.85;
  int64_t context_length = 0;
  std::string kv_dtype = "bf16";
  double price_per_gpu_hour = 0;
  bool json = false;
};

int run_plan(const PlanArgs& a) {
  const tools::GpuSpec* gpu = tools::find_gpu(a.gpu);
  if (!gpu) {
    std::fprintf(stderr, "moonrun plan: --gpu %s is not known (known: %s)\n", a.gpu.c_str(),
                 tools::known_gpu_names().c_str());
    return 2;
  }
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
  in.mem_fraction = a.mem_fraction;
  in.context_length = a.context_length;
  in.kv_dtype_bytes = a.kv_dtype == "fp8" ? 1 : 2;
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
  return 0;  // "does not fit" is an answer, not an error
}

}  // namespace

void add_plan_command(CLI::App& app) {
  auto args = std::make_shared<PlanArgs>();
  auto* cmd = app.add_subcommand(
      "plan", "Will a model fit a cluster: weights per GPU under TP x EP, valid TP sizes, KV/KDA cache room, cost");
  cmd->add_option("--model", args->model,
                  "kimi-k3 (built-in config), a config.json, or a checkpoint directory (exact bytes from its headers)")
      ->required();
  cmd->add_option("--gpu", args->gpu, "H100, H200, B200, B300 or GB300")->required();
  cmd->add_option("--gpus-per-node", args->gpus_per_node, "GPUs per node")->check(CLI::PositiveNumber);
  cmd->add_option("--nodes", args->nodes, "number of nodes")->check(CLI::PositiveNumber);
  cmd->add_option("--mem-fraction", args->mem_fraction,
                  "share of each GPU's usable memory for weights + caches (like --mem-fraction-static)")
      ->check(CLI::Range(0.01, 1.0));
  cmd->add_option("--context-length", args->context_length,
                  "tokens per sequence for the concurrency figure (default: the model's maximum)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--kv-dtype", args->kv_dtype, "KV cache dtype")->check(CLI::IsMember({"bf16", "fp8"}));
  cmd->add_option("--price-per-gpu-hour", args->price_per_gpu_hour, "USD per GPU per hour")
      ->check(CLI::NonNegativeNumber);
  cmd->add_flag("--json", args->json, "print JSON instead of the table");
  cmd->callback([args] {
    int rc = run_plan(*args);
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace moonrun::cli
