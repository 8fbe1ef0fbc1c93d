#pragma once
// The per-stage half of `moonrun plan` (issue #41): how a TP x EP x PP layout puts K3's
// layers on GPUs, what each GPU then reads in a decode step (by weight group), and what
// the step sends between GPUs: the collectives inside a stage's TP group and the
// activation hops between stages. bench/project_parallel.py turns these counts and bytes
// into time; nothing here assumes a latency or a bandwidth.
//
// The layout: `pp` stages of `tp` GPUs each, stage s on GPUs [s*tp, (s+1)*tp), so a stage
// stays inside a node whenever tp <= gpus_per_node. Layers are contiguous per stage and
// chosen so that the busiest stage's per-GPU bytes are as small as they can be (the
// embedding table goes with stage 0, the final norm and lm_head with the last stage). A
// layer's KDA state and MLA pages live on its stage.
#include <cstdint>
#include <string>
#include <vector>

#include "tools/plan_model.h"

namespace moonrun::tools {

// How the plan lays out the model. The two split options turn weights the loader
// replicates today into TP-split ones (plan only: the loader does not split them yet).
struct PipelineOptions {
  int tp = 1, ep = 1, pp = 1;
  int gpus_per_node = 8;
  // LatentMoE down projection column-split (its output all-gathered for the experts) and,
  // with split_latent_up, the up projection row-split (its partial sum joins the shared
  // experts' all-reduce, the routed sum reduced before it). With the up projection whole the
  // routed sum and the shared experts' partial sum are reduced as one buffer.
  bool split_latent_moe = false;
  bool split_latent_up = false;
  // The fp32 router column-split by expert (its logits all-gathered for the top-k).
  bool split_router = false;
  // DP attention x EP (--enable-dp-attention, ParallelRank::dp_attention): every rank holds
  // attention, the dense MLPs, the shared experts, the router, the LatentMoE projections and
  // the vocabulary whole, the routed experts as under EP; a sequence's caches on its one rank.
  // Per MoE layer the gather of every rank's rows and the routed experts' sum, once a step
  // the logits rows' gather (model/layers/moe.cpp moe_forward_dp). One stage, no split.
  bool dp_attention = false;
  int kv_dtype_bytes = 2;  // bf16 2, fp8 1: the stage's MLA pages
};

// One weight group's share on one GPU of a stage.
struct StageGroupBytes {
  std::string name;            // role_of_tensor()'s name: "MoE router", "KDA attention", ...
  Shard shard = Shard::kReplicated;  // as the loader splits it today
  bool split_by_option = false;      // replicated today, TP-split under this plan's options
  bool partly_split = false;         // only some of its tensors (--split-latent-moe-down)
  bool whole_by_dp_attention = false;  // TP-split today, whole on every rank under DP attention
  uint64_t per_gpu_bytes = 0;
};

// One kind of collective a stage's TP group issues per decode step. Bytes are per token of
// the step's batch (every one of these scales with the batch's rows).
struct StageCollective {
  std::string what;            // "attention o_proj all-reduce", ...
  bool all_gather = false;     // else an all-reduce
  int64_t count = 0;           // calls per decode step
  uint64_t bytes_per_token = 0;  // one call's whole message, per token
};

struct PipelineStage {
  int index = 0;
  int first_layer = 0, end_layer = 0;  // [first, end)
  int64_t n_mla = 0, n_kda = 0, n_moe = 0, n_dense_mlp = 0;
  bool has_embedding = false, has_head = false;
  std::vector<StageGroupBytes> groups;
  uint64_t per_gpu_bytes = 0;          // sum of groups
  uint64_t kv_bytes_per_token = 0;     // this stage's MLA layers, whole latent on each rank
  uint64_t kda_state_per_gpu_bytes_per_seq = 0;  // this stage's KDA layers, split by heads
                                                 // (DP attention: whole, on the sequence's rank)
  std::vector<StageCollective> collectives;
  int64_t collectives_per_step = 0;    // sum of counts
  bool collectives_cross_nodes = false;  // the TP group spans nodes
};

// The activations one stage hands the next, once per micro-batch; the last stage's hop goes
// round the ring to stage 0 (the rows that get logits: model/pipeline.h).
struct StageHop {
  int from_stage = 0;
  uint64_t bytes_per_token = 0;  // K3: the attention-residual state (prefix + block sums), fp32
  bool cross_node = false;
};

struct PipelinePlan {
  PipelineOptions opt;
  std::vector<PipelineStage> stages;
  std::vector<StageHop> hops;
  uint64_t max_stage_per_gpu_bytes = 0;   // the busiest stage's GPU: what must fit
  int64_t collectives_per_step = 0;       // all stages
  int64_t cross_node_collectives_per_step = 0;
  // What each split option takes off the busiest stage's GPU per step (whether or not it
  // is on): the group's replicated bytes x (1 - 1/tp).
  uint64_t latent_moe_split_saves_per_gpu = 0;
  uint64_t router_split_saves_per_gpu = 0;
};

// `extra_replicated`: groups the model's listing lacks (the vision tower), put on stage 0.
PipelinePlan plan_pipeline(const PlanModelShape& shape, const PipelineOptions& opt,
                           const std::vector<WeightGroup>& extra_replicated = {});

}  // namespace moonrun::tools
