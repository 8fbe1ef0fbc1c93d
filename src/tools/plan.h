#pragma once
// `moonrun plan`: the arithmetic the seeds do by hand before renting GPUs. Given a model
// (checkpoint or config), a GPU and a cluster shape it answers: what the weights weigh in
// total and per GPU under TP x EP, which TP sizes the model allows and why the others fail,
// what memory is left per GPU for the caches, how many tokens and full-length sequences
// that holds, whether it fits (two rules, below), and what it costs per hour.
//
// Two fit rules, both shown:
//  - per GPU (what an engine does): usable x mem_fraction must hold this GPU's share of the
//    weights with room left for the KV pool and KDA state;
//  - the seeds' whole-VM rule: 92 % of the machine's nominal memory minus the checkpoint,
//    an upper bound on what is left for cache and runtime.
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "tools/plan_gpus.h"
#include "tools/plan_model.h"
#include "tools/plan_pipeline.h"

namespace moonrun::tools {

struct PlanInputs {
  PlanModelShape shape;
  WeightBytes weights;
  GpuSpec gpu;
  int gpus_per_node = 8;
  int nodes = 1;
  int tp = 0;                     // 0: every GPU of a stage (the seeds' flat TP group)
  int pp = 1;                     // pipeline stages (--pp-size): tp x pp = every GPU
  bool split_latent_moe = false;  // plan the LatentMoE down projection TP-split
  bool split_latent_up = false;   // and the up projection
  bool split_router = false;      // plan the fp32 router TP-split (by expert)
  bool dp_attention = false;      // --enable-dp-attention: attention, dense layers, vocabulary
                                  // whole on every rank, routed experts under EP (PP 1, no split)
  int ep = 0;                     // 0: = tp
  double mem_fraction = 0.85;     // share of usable memory for weights + caches (SGLang's
                                  // --mem-fraction-static, the seed's 0.85)
  int64_t context_length = 0;     // 0 = the model's max_position_embeddings
  int kv_dtype_bytes = 2;         // bf16 2, fp8 1
  double price_per_gpu_hour = 0;  // 0 = not given
};

struct TpCheck {
  int tp = 0;
  bool ok = false;
  std::string why;  // "96 heads / 64 = 1.5 per rank" when not ok
};

struct Plan {
  PlanInputs in;
  int total_gpus = 0, tp = 0, ep = 0, pp = 1;
  int64_t context_length = 0;
  int tp_gcd = 0;                      // gcd of everything TP must divide
  std::vector<int> valid_tp;           // the divisors of tp_gcd
  std::vector<TpCheck> invalid_examples;  // common sizes that fail, with the reason
  TpCheck tp_check;                    // the chosen TP (= all GPUs)
  int64_t experts_per_gpu = 0;         // ceil(num_experts / EP)

  uint64_t checkpoint_bytes = 0;       // total download (weights + file headers)
  uint64_t weights_per_gpu_bytes = 0;  // TP share + EP share + replicated (the busiest stage's
                                       // GPU under PP or a split option)
  PipelinePlan pipeline;               // stages, bytes by group, collectives, hops (issue #41)
  uint64_t usable_per_gpu_bytes = 0;
  uint64_t budget_per_gpu_bytes = 0;   // usable x mem_fraction
  int64_t left_per_gpu_bytes = 0;      // budget - weights (negative: does not fit)
  uint64_t reserve_per_gpu_bytes = 0;  // usable - budget: activations, CUDA graphs, NCCL

  uint64_t kv_bytes_per_token = 0;     // MLA layers x (kv_lora + rope) x dtype; every TP rank
                                       // holds the whole latent, so this is also per GPU (the
                                       // stage with the most MLA layers under PP)
  uint64_t kda_state_bytes_per_seq = 0;       // whole model: S (fp32) + conv windows (bf16)
  uint64_t kda_recurrent_bytes_per_seq = 0;   // the S part alone
  uint64_t kda_state_per_gpu_bytes_per_seq = 0;  // split by heads over TP (the busiest stage's
                                                 // layers under PP)
  uint64_t kv_bytes_per_seq = 0;       // at context_length
  int64_t pool_tokens = 0;             // left / kv_bytes_per_token (no KDA state)
  int64_t concurrent_seqs = 0;         // full-length sequences that fit at once
  std::vector<std::string> kv_assumptions;  // what the two figures above take for granted

  uint64_t vm_nominal_bytes = 0;       // nodes x gpus x nominal
  int64_t vm_rule_left_bytes = 0;      // 0.92 x vm_nominal - checkpoint

  bool fits = false;
  std::vector<std::string> reasons;    // why it fits or not, and warnings
  double cost_per_hour = 0;
};

Result<Plan> make_plan(const PlanInputs& in);

std::string format_plan_table(const Plan& plan);
nlohmann::json plan_to_json(const Plan& plan);

// Loads --model: "kimi-k3" (built in), a config.json file, or a checkpoint directory (its
// config.json for the shape, its safetensors headers for the exact bytes).
struct LoadedModel {
  PlanModelShape shape;
  WeightBytes weights;
};
Result<LoadedModel> load_plan_model(const std::string& model);

}  // namespace moonrun::tools
