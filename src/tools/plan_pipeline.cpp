// Stages, per-GPU bytes by group and per-step traffic of a TP x EP x PP plan (see
// plan_pipeline.h).
#include "tools/plan_pipeline.h"

#include <algorithm>
#include <cstdlib>
#include <limits>
#include <map>

#include "model/pipeline.h"
#include "model/weight_spec.h"

namespace moonrun::tools {

namespace {

constexpr const char* kLatentMoeGroup = "LatentMoE down/up projections";
constexpr const char* kRouterGroup = "MoE router";

// Bytes one GPU holds of one layer (or of what comes before / after the layers), by group.
using GroupMap = std::map<std::string, StageGroupBytes>;

void add(GroupMap& m, const std::string& name, Shard shard, bool split, uint64_t bytes, bool whole = false,
         bool partly = false) {
  const bool fresh = m.find(name) == m.end();
  StageGroupBytes& g = m[name];
  // A group some of whose tensors an option splits and some not (--split-latent-moe-down:
  // the down projection split, the up one whole).
  g.partly_split = partly || (!fresh && g.split_by_option != split) || (!fresh && g.partly_split);
  g.name = name;
  g.shard = shard;
  g.split_by_option = g.split_by_option || split;
  g.whole_by_dp_attention = whole;
  g.per_gpu_bytes += bytes;
}

uint64_t total(const GroupMap& m) {
  uint64_t t = 0;
  for (const auto& [_, g] : m) t += g.per_gpu_bytes;
  return t;
}


}  // namespace

PipelinePlan plan_pipeline(const PlanModelShape& shape, const PipelineOptions& opt,
                           const std::vector<WeightGroup>& extra_replicated) {
  const ModelConfig& cfg = shape.config;
  const int L = cfg.num_hidden_layers;
  const int tp = std::max(opt.tp, 1), ep = std::max(opt.ep, 1), pp = std::clamp(opt.pp, 1, std::max(L, 1));
  PipelinePlan out;
  out.opt = opt;

  // ---- every tensor's bytes on one GPU of the stage that holds it.
  const int64_t E = shape.n_experts;
  const double expert_share =
      E > 0 ? double((E + ep - 1) / ep) / double(E) / double(std::max(tp / ep, 1)) : 0.0;  // busiest rank
  std::vector<GroupMap> layer(size_t(std::max(L, 0)));
  GroupMap pre, post;  // embedding (+ vision) on stage 0; final norm, output mix, lm_head last
  std::vector<uint64_t> replicated_latent(size_t(std::max(L, 0)), 0), replicated_router(size_t(std::max(L, 0)), 0);
  const std::string layer_prefix = cfg.tensor_prefix + "layers.";
  for (const TensorSpec& t : weight_spec(cfg)) {
    const std::string role = role_of_tensor(t.name, &cfg);
    const Shard shard = shard_of_rule(t.shard);
    // The LatentMoE up projection splits only with --split-latent-moe (both), the down one
    // also with --split-latent-moe-down.
    const bool latent_up = t.name.find("routed_expert_up_proj") != std::string::npos;
    const bool split = (role == kLatentMoeGroup && opt.split_latent_moe && (opt.split_latent_up || !latent_up)) ||
                       (opt.split_router && role == kRouterGroup);
    const uint64_t n = t.nbytes();
    uint64_t bytes = n;
    // DP attention: the dense shard rules take the whole tensor (weight_spec.cpp dense_shard).
    const bool whole = opt.dp_attention && shard == Shard::kTensorParallel;
    if (whole) bytes = n;
    else if (shard == Shard::kTensorParallel || split) bytes = n / uint64_t(tp);
    else if (shard == Shard::kExpertParallel) bytes = uint64_t(double(n) * expert_share);
    // Outside the layers: stage 0's (embedding, vision, and, round the ring, norm and
    // lm_head), but the output AttnRes mix, the last stage's: as the runtime (model/pipeline.h).
    GroupMap* into = t.name.find("output_attn_res") != std::string::npos ? &post : &pre;
    int li = -1;
    if (t.name.rfind(layer_prefix, 0) == 0) {
      li = std::atoi(t.name.c_str() + layer_prefix.size());
      if (li >= 0 && li < L) into = &layer[size_t(li)];
    }
    add(*into, role, shard, split, bytes, whole);
    if (into != &pre && into != &post) {
      if (role == kLatentMoeGroup) replicated_latent[size_t(li)] += n;
      if (role == kRouterGroup) replicated_router[size_t(li)] += n;
    }
  }
  for (const WeightGroup& g : extra_replicated) add(pre, g.name, g.shard, false, g.bytes);

  // ---- stages: contiguous layers, balanced bytes.
  std::vector<uint64_t> layer_bytes;
  for (const GroupMap& m : layer) layer_bytes.push_back(total(m));
  const std::vector<int> bounds = L > 0 ? balanced_layer_bounds(layer_bytes, total(pre), total(post), pp)
                                        : std::vector<int>(size_t(pp) + 1, 0);

  // Collective messages, per token. The forward's sums run in fp32 (model/layers: o_proj,
  // the MLPs and the routed experts' weighted sum all reduce an fp32 [T, width]).
  const uint64_t hidden_f32 = uint64_t(cfg.hidden_size) * 4;
  const uint64_t latent_f32 = uint64_t(cfg.expert_io_dim()) * 4;
  const uint64_t P = uint64_t(shape.kda_heads) * uint64_t(shape.kda_head_dim);
  const uint64_t kda_layer_state = P * uint64_t(shape.kda_head_dim) * 4 +
                                   3 * uint64_t(std::max<int64_t>(shape.kda_conv_kernel - 1, 0)) * P * 2;
  const uint64_t mla_row = uint64_t(shape.kv_lora_rank + shape.qk_rope_head_dim) * uint64_t(opt.kv_dtype_bytes);

  for (int s = 0; s < pp; ++s) {
    PipelineStage st;
    st.index = s;
    st.first_layer = bounds[size_t(s)];
    st.end_layer = bounds[size_t(s) + 1];
    st.has_embedding = s == 0;
    st.has_head = s == 0;  // the ring: logits and sampling where the embedding is
    GroupMap groups;
    auto merge = [&](const GroupMap& m) {
      for (const auto& [name, g] : m)
        add(groups, name, g.shard, g.split_by_option, g.per_gpu_bytes, g.whole_by_dp_attention, g.partly_split);
    };
    if (st.has_embedding) merge(pre);
    uint64_t stage_latent = 0, stage_router = 0;
    for (int i = st.first_layer; i < st.end_layer; ++i) {
      merge(layer[size_t(i)]);
      stage_latent += replicated_latent[size_t(i)];
      stage_router += replicated_router[size_t(i)];
      const LayerSpec& ls = cfg.layers[size_t(i)];
      if (ls.attn == LayerKind::mla) {
        ++st.n_mla;
        st.kv_bytes_per_token += mla_row + (ls.dsa_index >= 0 ? uint64_t(shape.dsa_key_bytes) : 0);
      } else {
        ++st.n_kda;
        // DP attention: every head on the rank that owns the sequence.
        st.kda_state_per_gpu_bytes_per_seq += opt.dp_attention ? kda_layer_state : kda_layer_state / uint64_t(tp);
      }
      if (ls.mlp == MlpKind::moe) ++st.n_moe;
      else ++st.n_dense_mlp;
    }
    if (s == pp - 1) merge(post);
    for (auto& [_, g] : groups) {
      st.groups.push_back(g);
      st.per_gpu_bytes += g.per_gpu_bytes;
    }
    const uint64_t keep = opt.dp_attention ? 1 : uint64_t(tp);  // DP attention: no split applies
    out.latent_moe_split_saves_per_gpu = std::max(out.latent_moe_split_saves_per_gpu, stage_latent - stage_latent / keep);
    out.router_split_saves_per_gpu = std::max(out.router_split_saves_per_gpu, stage_router - stage_router / keep);

    // ---- the stage's collectives: where the forward sums over its TP group (docs/
    // architecture.md, "Parallelism"), none at TP 1.
    auto coll = [&](const std::string& what, bool gather, int64_t count, uint64_t bytes) {
      if (count > 0) st.collectives.push_back({what, gather, count, bytes});
    };
    if (tp > 1 && opt.dp_attention) {
      // DP attention (model/layers/moe.cpp moe_forward_dp, ModelRunner::step_dp): no o_proj,
      // dense MLP, shared-expert or embedding all-reduce. Each MoE layer gathers every rank's
      // rows as a sum (its rows in place, zeros elsewhere; hidden, fp32) and all-reduces the
      // routed experts' sum over all of them (the LatentMoE width for K3, else hidden; the
      // shared experts are whole, so not in it); the logits rows are gathered the same way
      // once a step. Bytes per token of the whole group's step (every rank's rows).
      coll("DP gather of every rank's rows (sum)", false, st.n_moe, hidden_f32);
      coll("routed experts' sum all-reduce", false, st.n_moe, latent_f32);
      if (st.has_head) coll("DP gather of the logits rows (sum)", false, 1, uint64_t(cfg.vocab_size) * 4);
    } else if (tp > 1) {
      if (st.has_embedding) coll("vocab-parallel embedding all-reduce", false, 1, hidden_f32);
      coll("attention o_proj all-reduce", false, st.n_mla + st.n_kda, hidden_f32);
      coll("dense MLP down all-reduce", false, st.n_dense_mlp, hidden_f32);
      const bool shared = cfg.num_shared_experts > 0;
      if (cfg.routed_expert_hidden_size == 0 && shared) {
        // No LatentMoE (K2): the routed and shared partial sums are added and reduced once
        // (model/layers/moe.cpp).
        coll("routed + shared experts' sum all-reduce", false, st.n_moe, hidden_f32);
      } else if (!opt.split_latent_up && shared) {
        // The up projection whole on every rank: the routed sum (before the latent norm) and
        // the shared experts' partial sum reduced as one buffer (model/layers/moe.cpp).
        coll("routed sum + shared experts' all-reduce (packed)", false, st.n_moe, latent_f32 + hidden_f32);
      } else {
        coll("routed experts' sum all-reduce", false, st.n_moe, latent_f32);
        // The split LatentMoE up projection is row-parallel: its partial sum rides the shared
        // experts' all-reduce, so it costs nothing extra when there are shared experts.
        coll(shared ? "shared experts (+ split latent up) all-reduce" : "split latent up all-reduce", false,
             shared || opt.split_latent_up ? st.n_moe : 0, hidden_f32);
      }
      // The split down projection's output and the split router's logits: an all-gather
      // per MoE layer (the experts need the whole latent row, the top-k every logit), in
      // fp32 as the runtime gathers them; both split, one packed gather carries both
      // (model/layers/moe.cpp, Ops::all_gather_cols_packed).
      const bool latent_split = opt.split_latent_moe && cfg.routed_expert_hidden_size > 0;
      if (latent_split && opt.split_router)
        coll("split latent down + router logits all-gather (packed)", true, st.n_moe,
             uint64_t(cfg.expert_io_dim()) * 4 + uint64_t(E) * 4);
      else if (latent_split)
        coll("split latent down all-gather", true, st.n_moe, uint64_t(cfg.expert_io_dim()) * 4);
      else if (opt.split_router)
        coll("split router logits all-gather", true, st.n_moe, uint64_t(E) * 4);
      if (st.has_head) coll("lm_head logits all-gather", true, 1, uint64_t(cfg.vocab_size) * 4);
    }
    for (const auto& c : st.collectives) st.collectives_per_step += c.count;
    // Stage s sits on GPUs [s*tp, (s+1)*tp): it spans nodes when its first and last GPU differ.
    const int gpn = std::max(opt.gpus_per_node, 1);
    st.collectives_cross_nodes = (s * tp) / gpn != ((s + 1) * tp - 1) / gpn;
    out.collectives_per_step += st.collectives_per_step;
    if (st.collectives_cross_nodes) out.cross_node_collectives_per_step += st.collectives_per_step;
    out.max_stage_per_gpu_bytes = std::max(out.max_stage_per_gpu_bytes, st.per_gpu_bytes);

    if (s + 1 < pp) {
      // What the next stage needs of each token: with Attention Residuals (K3_SPEC.md
      // section 2) the running prefix and every completed block summary, not one hidden row.
      // A summary is appended at each layer i with i % B == 0, so ceil(end / B) of them.
      const int B = cfg.attn_res_block_size;
      const uint64_t rows = B > 0 ? 1 + uint64_t((st.end_layer + B - 1) / B) : 1;
      out.hops.push_back({s, rows * hidden_f32, (s * tp) / gpn != ((s + 1) * tp) / gpn});
    } else if (pp > 1) {
      // Round the ring: the last stage's rows that get logits (one a decode token) go back to
      // stage 0's norm and lm_head.
      out.hops.push_back({s, hidden_f32, (s * tp) / gpn != 0});
    }
    out.stages.push_back(std::move(st));
  }
  return out;
}

}  // namespace moonrun::tools
