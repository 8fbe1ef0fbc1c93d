// `moonrun plan` arithmetic and report (see plan.h).
#include "tools/plan.h"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <sstream>

#include "model/checkpoint.h"
#include "tools/kimi_k3_config.h"

namespace moonrun::tools {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr double kGB = 1e9;
constexpr double kGiB = 1024.0 * 1024 * 1024;
// The seeds' whole-VM rule: "92 % of the VM's memory minus the checkpoint".
constexpr double kVmRuleFraction = 0.92;

std::string with_commas(int64_t v) {
  std::string digits = std::to_string(v < 0 ? -v : v), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return (v < 0 ? "-" : "") + out;
}

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

// "1,560.94 GB"; small models in MB or bytes so tiny checkpoints still read.
std::string gb(double bytes) {
  const double a = std::fabs(bytes);
  if (a > 0 && a < 1e6) return with_commas(int64_t(std::llround(bytes))) + " B";
  if (a > 0 && a < 1e8) return fmt("%.2f MB", bytes / 1e6);
  double v = bytes / kGB;
  double whole = std::floor(std::fabs(v));
  std::string frac = fmt("%.2f", std::fabs(v) - whole).substr(1);  // ".94"
  if (std::fabs(v) - whole >= 0.995) whole += 1, frac = ".00";       // rounding carried
  return (v < 0 ? "-" : "") + with_commas(int64_t(whole)) + frac + " GB";
}

// " (1.23 GiB)" beside a decimal figure; nothing when it would round to 0.00.
std::string gib(double bytes) {
  if (std::fabs(bytes) < 0.005 * kGiB) return "";
  return fmt(" (%.2f GiB)", bytes / kGiB);
}

// Why TP = t fails for this model, or "" when it divides everything it must.
std::string tp_failure(const PlanModelShape& s, int t) {
  auto per_rank = [&](int64_t n) { return fmt("%g", double(n) / t); };
  if (s.n_heads % t != 0)
    return std::to_string(s.n_heads) + " attention heads / " + std::to_string(t) + " = " +
           per_rank(s.n_heads) + " per rank";
  if (s.hidden % t != 0)
    return "hidden " + std::to_string(s.hidden) + " / " + std::to_string(t) + " = " + per_rank(s.hidden) +
           " per rank";
  if (s.n_kda_layers > 0 && s.kda_heads % t != 0)
    return std::to_string(s.kda_heads) + " KDA heads / " + std::to_string(t) + " = " + per_rank(s.kda_heads) +
           " per rank";
  return "";
}

// Per stage: the layers, what one GPU holds by group, the collectives a decode step issues
// and the hops between stages (issue #41). Bytes per token: a step of T tokens sends T x.
std::string format_pipeline(const Plan& p) {
  const PipelinePlan& pl = p.pipeline;
  std::ostringstream o;
  char buf[320];
  const PipelineOptions& opt = pl.opt;
  if (opt.dp_attention)
    o << "\nPer GPU under DP attention " << p.tp << " x EP " << p.ep
      << " (attention, dense MLPs, shared experts, router, LatentMoE projections and vocabulary whole on every "
         "rank; routed experts split over EP " << p.ep << (p.tp / p.ep > 1 ? " x " + std::to_string(p.tp / p.ep) + " ranks an expert" : std::string())
      << ")\n";
  else
    o << "\nPer GPU by stage (TP " << p.tp << " x EP " << p.ep << " x PP " << p.pp
      << "; LatentMoE projections " << (!opt.split_latent_moe ? "replicated" : opt.split_latent_up ? "TP-split" : "down TP-split, up replicated") << ", router "
      << (opt.split_router ? "TP-split" : "replicated") << ")\n";
  for (const PipelineStage& st : pl.stages) {
    std::snprintf(buf, sizeof buf, "  stage %d: layers %d-%d (%lld MLA, %lld KDA, %lld MoE)%s%s, GPUs %d-%d: %s a GPU\n",
                  st.index, st.first_layer, st.end_layer - 1, (long long)st.n_mla, (long long)st.n_kda,
                  (long long)st.n_moe, st.has_embedding ? " + embedding" : "", st.has_head ? " + head" : "",
                  st.index * p.tp, (st.index + 1) * p.tp - 1, gb(double(st.per_gpu_bytes)).c_str());
    o << buf;
    for (const StageGroupBytes& g : st.groups) {
      std::snprintf(buf, sizeof buf, "    %-46s %-10s %14s\n", g.name.c_str(),
                    g.partly_split            ? "part split"
                    : g.split_by_option       ? "TP (split)"
                    : g.whole_by_dp_attention ? "whole (DP)"
                                              : shard_name(g.shard),
                    gb(double(g.per_gpu_bytes)).c_str());
      o << buf;
    }
    std::snprintf(buf, sizeof buf, "    collectives a decode step: %lld%s\n", (long long)st.collectives_per_step,
                  st.collectives_per_step == 0 ? ""
                  : st.collectives_cross_nodes ? ", every one across nodes"
                                               : ", inside one node");
    o << buf;
    for (const StageCollective& c : st.collectives) {
      std::snprintf(buf, sizeof buf, "      %4lld x %-44s %8s a token\n", (long long)c.count, c.what.c_str(),
                    with_commas(int64_t(c.bytes_per_token)).c_str());
      o << buf;
    }
    std::snprintf(buf, sizeof buf, "    caches on this stage: KV %s B a token, KDA state %s a sequence a GPU%s\n",
                  with_commas(int64_t(st.kv_bytes_per_token)).c_str(),
                  gb(double(st.kda_state_per_gpu_bytes_per_seq)).c_str(),
                  opt.dp_attention ? " (whole, on the sequence's one rank)" : "");
    o << buf;
  }
  for (const StageHop& h : pl.hops) {
    const bool back = h.from_stage == p.pp - 1;  // round the ring: the logit rows to stage 0
    std::snprintf(buf, sizeof buf, "  hop stage %d -> %d: %s B a token (%s, fp32), %s\n", h.from_stage,
                  back ? 0 : h.from_stage + 1, with_commas(int64_t(h.bytes_per_token)).c_str(),
                  back ? "the rows that get logits, back to the head" : "attention-residual state",
                  h.cross_node ? "across nodes" : "inside one node");
    o << buf;
  }
  std::snprintf(buf, sizeof buf, "  a decode step: %lld collectives (%lld across nodes), %zu activation hop(s)\n",
                (long long)pl.collectives_per_step, (long long)pl.cross_node_collectives_per_step, pl.hops.size());
  o << buf;
  if (opt.dp_attention)
    o << "  bytes a token are of the whole group's step (every rank's rows); no attention, dense MLP, shared-expert "
         "or embedding all-reduce\n";
  else if (p.tp > 1)  // at TP 1 there is nothing to split
    o << "  splitting over TP " << p.tp << " would save a GPU of the busiest stage, each step: LatentMoE projections "
    << gb(double(pl.latent_moe_split_saves_per_gpu)) << ", router " << gb(double(pl.router_split_saves_per_gpu))
    << " (--split-latent-moe: an all-gather and an all-reduce more a MoE layer; the down projection, half of it, "
       "for an all-gather: --split-latent-moe-down; the router for an all-gather: --split-router)\n";
  return o.str();
}

json pipeline_to_json(const PipelinePlan& pl) {
  json stages = json::array();
  for (const PipelineStage& st : pl.stages) {
    json groups = json::array(), colls = json::array();
    for (const StageGroupBytes& g : st.groups) {
      groups.push_back({{"name", g.name}, {"shard", g.split_by_option ? "TP" : shard_name(g.shard)},
                        {"split_by_option", g.split_by_option}, {"partly_split", g.partly_split},
                        {"per_gpu_bytes", g.per_gpu_bytes}});
      if (pl.opt.dp_attention) groups.back()["whole_by_dp_attention"] = g.whole_by_dp_attention;
    }
    for (const StageCollective& c : st.collectives)
      colls.push_back({{"what", c.what}, {"kind", c.all_gather ? "all_gather" : "all_reduce"}, {"count", c.count},
                       {"bytes_per_token", c.bytes_per_token}});
    stages.push_back({{"stage", st.index}, {"first_layer", st.first_layer}, {"end_layer", st.end_layer},
                      {"mla_layers", st.n_mla}, {"kda_layers", st.n_kda}, {"moe_layers", st.n_moe},
                      {"dense_mlp_layers", st.n_dense_mlp}, {"embedding", st.has_embedding}, {"head", st.has_head},
                      {"per_gpu_bytes", st.per_gpu_bytes}, {"groups", groups},
                      {"kv_bytes_per_token", st.kv_bytes_per_token},
                      {"kda_state_per_gpu_bytes_per_sequence", st.kda_state_per_gpu_bytes_per_seq},
                      {"collectives", colls}, {"collectives_per_step", st.collectives_per_step},
                      {"collectives_cross_nodes", st.collectives_cross_nodes}});
  }
  json hops = json::array();
  for (const StageHop& h : pl.hops)
    hops.push_back({{"from_stage", h.from_stage}, {"bytes_per_token", h.bytes_per_token}, {"cross_node", h.cross_node}});
  json out = {{"pp", pl.opt.pp}, {"split_latent_moe", pl.opt.split_latent_moe},
              {"split_latent_up", pl.opt.split_latent_moe && pl.opt.split_latent_up}, {"split_router", pl.opt.split_router},
              {"stages", stages}, {"hops", hops}, {"max_stage_per_gpu_bytes", pl.max_stage_per_gpu_bytes},
              {"collectives_per_step", pl.collectives_per_step},
              {"cross_node_collectives_per_step", pl.cross_node_collectives_per_step},
              {"latent_moe_split_saves_per_gpu_bytes", pl.latent_moe_split_saves_per_gpu},
              {"router_split_saves_per_gpu_bytes", pl.router_split_saves_per_gpu}};
  if (pl.opt.dp_attention) out["dp_attention"] = true;  // absent otherwise: the default output as before
  return out;
}

}  // namespace

Result<Plan> make_plan(const PlanInputs& in) {
  const PlanModelShape& s = in.shape;
  if (in.gpus_per_node < 1 || in.nodes < 1)
    return invalid_argument("--gpus-per-node and --nodes must be at least 1");
  if (!(in.mem_fraction > 0 && in.mem_fraction <= 1))
    return invalid_argument("--mem-fraction must be in (0, 1], got " + fmt("%g", in.mem_fraction));
  if (in.kv_dtype_bytes != 1 && in.kv_dtype_bytes != 2)
    return invalid_argument("--kv-dtype must be bf16 or fp8");

  Plan p;
  p.in = in;
  p.total_gpus = in.gpus_per_node * in.nodes;
  // The seeds' shape: one flat group, TP over every GPU for attention and dense weights, EP
  // over the same GPUs (or a divisor of them) for routed experts: the world is the TP group,
  // as in SGLang. With --pp-size, `pp` such groups of tp GPUs, one per pipeline stage.
  if (in.pp < 1) return invalid_argument("--pp-size must be at least 1");
  p.pp = in.pp;
  if (p.pp > s.n_layers && s.n_layers > 0)
    return invalid_argument("--pp-size " + std::to_string(p.pp) + " is more stages than the model's " +
                            std::to_string(s.n_layers) + " layers");
  p.tp = in.tp > 0 ? in.tp : p.total_gpus / p.pp;
  p.ep = in.ep > 0 ? in.ep : p.tp;
  if (p.tp * p.pp != p.total_gpus)
    return invalid_argument("--tp-size " + std::to_string(p.tp) + " x --pp-size " + std::to_string(p.pp) +
                            " but the cluster has " + std::to_string(in.nodes) + " node(s) x " +
                            std::to_string(in.gpus_per_node) + " GPUs = " + std::to_string(p.total_gpus) +
                            ": TP x PP spans every GPU of every node; set --nnodes or --gpus-per-node to match");
  if (p.ep < 1 || p.tp % p.ep != 0)
    return invalid_argument("--ep-size " + std::to_string(p.ep) + " must divide --tp-size " + std::to_string(p.tp));
  if (in.dp_attention) {
    // As the runtime refuses them (runtime/runtime_builder.cpp).
    if (p.tp < 2) return invalid_argument("--enable-dp-attention needs a group to share the experts: --tp-size >= 2");
    if (p.pp > 1) return invalid_argument("--enable-dp-attention with --pp-size > 1 is not built yet");
    if (in.split_router || in.split_latent_moe || in.split_latent_up)
      return invalid_argument("--enable-dp-attention holds the router and the LatentMoE projections whole on every "
                              "rank: not with --split-router / --split-latent-moe");
  }
  p.context_length = in.context_length > 0 ? in.context_length
                     : s.max_context > 0   ? s.max_context
                                           : 1048576;

  // ---- tensor parallel sizes: TP must divide the heads and the hidden width.
  int64_t g = std::gcd(s.n_heads, s.hidden);
  if (s.n_kda_layers > 0) g = std::gcd(g, s.kda_heads);
  p.tp_gcd = int(g);
  for (int t = 1; t <= g; ++t)
    if (g % t == 0) p.valid_tp.push_back(t);
  // Common sizes that fail (3 nodes' worth, 5 nodes of 8, ...), up to the next power of two.
  for (int t : {3, 24, 40, 48, 64, 128, int(2 * g)}) {
    std::string why = tp_failure(s, t);
    bool seen = false;
    for (const auto& c : p.invalid_examples) seen |= c.tp == t;
    if (!why.empty() && !seen && t <= 2 * g && p.invalid_examples.size() < 5) p.invalid_examples.push_back({t, false, why});
  }
  p.tp_check = {p.tp, true, in.dp_attention ? "" : tp_failure(s, p.tp)};  // DP attention: heads whole on every rank
  p.tp_check.ok = p.tp_check.why.empty();

  // ---- weights: total and this GPU's share.
  const WeightBytes& w = in.weights;
  p.checkpoint_bytes = w.total_bytes();
  const uint64_t tp_bytes = w.bytes_of(Shard::kTensorParallel);
  const uint64_t ep_bytes = w.bytes_of(Shard::kExpertParallel);
  const uint64_t rep_bytes = w.bytes_of(Shard::kReplicated);
  uint64_t ep_share = 0;
  if (s.n_experts > 0) {
    p.experts_per_gpu = (s.n_experts + p.ep - 1) / p.ep;  // the busiest rank
    // Each expert is further split TP/EP ways inside its EP group.
    ep_share = uint64_t(double(ep_bytes) * double(p.experts_per_gpu) / double(s.n_experts) / double(p.tp / p.ep));
  }
  // DP attention: the TP groups whole on every rank, the experts as under EP.
  p.weights_per_gpu_bytes = (in.dp_attention ? tp_bytes : tp_bytes / p.tp) + ep_share + rep_bytes;

  // ---- stages, bytes by group, per-step traffic. Without PP or a split option the figure
  // above stands (it is exact for a checkpoint); otherwise the busiest stage's GPU.
  std::vector<WeightGroup> unlisted;  // groups the model's name table lacks: the vision tower
  for (const WeightGroup& g : w.groups)
    if (g.name.rfind("vision", 0) == 0) unlisted.push_back(g);
  PipelineOptions popt;
  popt.tp = p.tp, popt.ep = p.ep, popt.pp = p.pp, popt.gpus_per_node = in.gpus_per_node;
  popt.split_latent_moe = in.split_latent_moe, popt.split_router = in.split_router;
  popt.split_latent_up = in.split_latent_moe && in.split_latent_up;
  popt.dp_attention = in.dp_attention;
  popt.kv_dtype_bytes = in.kv_dtype_bytes;
  p.pipeline = plan_pipeline(s, popt, unlisted);
  const bool staged = p.pp > 1 || in.split_latent_moe || in.split_router;
  if (staged) p.weights_per_gpu_bytes = p.pipeline.max_stage_per_gpu_bytes;

  // ---- memory per GPU.
  p.usable_per_gpu_bytes = in.gpu.usable_bytes;
  p.budget_per_gpu_bytes = uint64_t(double(in.gpu.usable_bytes) * in.mem_fraction);
  p.reserve_per_gpu_bytes = p.usable_per_gpu_bytes - p.budget_per_gpu_bytes;
  p.left_per_gpu_bytes = int64_t(p.budget_per_gpu_bytes) - int64_t(p.weights_per_gpu_bytes);

  // ---- caches. MLA keeps latent + rope key per token per layer; every TP rank holds all of
  // it (the latent is shared by the heads, so it is not split).
  p.kv_bytes_per_token = uint64_t(s.n_mla_layers) * uint64_t(s.kv_lora_rank + s.qk_rope_head_dim) *
                         uint64_t(in.kv_dtype_bytes);
  // K3.1's DSA layers also keep each token's indexer key beside its latent row, FP8 with an
  // fp32 scale per 128 values whatever the latent's dtype (DeepSeek-V3.2's indexer cache),
  // whole on every TP rank (the indexer is replicated).
  p.kv_bytes_per_token += uint64_t(s.n_dsa_layers) * uint64_t(s.dsa_key_bytes);
  // KDA: per layer S [heads, d_k, d_v] fp32 and three conv windows of (K-1) rows of heads x d
  // in bf16 (the activations' dtype). Split by heads over TP.
  const uint64_t P = uint64_t(s.kda_heads) * uint64_t(s.kda_head_dim);
  p.kda_recurrent_bytes_per_seq = uint64_t(s.n_kda_layers) * P * uint64_t(s.kda_head_dim) * 4;
  p.kda_state_bytes_per_seq = p.kda_recurrent_bytes_per_seq +
                              uint64_t(s.n_kda_layers) * 3 * uint64_t(std::max<int64_t>(s.kda_conv_kernel - 1, 0)) * P * 2;
  // Under DP attention a sequence's state is whole (every head) on its one rank.
  p.kda_state_per_gpu_bytes_per_seq = in.dp_attention ? p.kda_state_bytes_per_seq : p.kda_state_bytes_per_seq / p.tp;
  if (p.pp > 1) {
    // A layer's MLA pages and KDA state live on its stage: size the pool by the stage that
    // needs the most per token and per sequence (every stage's pool holds the same slots).
    p.kv_bytes_per_token = 0, p.kda_state_per_gpu_bytes_per_seq = 0;
    for (const PipelineStage& st : p.pipeline.stages) {
      p.kv_bytes_per_token = std::max(p.kv_bytes_per_token, st.kv_bytes_per_token);
      p.kda_state_per_gpu_bytes_per_seq = std::max(p.kda_state_per_gpu_bytes_per_seq, st.kda_state_per_gpu_bytes_per_seq);
    }
  }
  p.kv_bytes_per_seq = p.kv_bytes_per_token * uint64_t(p.context_length);
  if (p.left_per_gpu_bytes > 0) {
    if (p.kv_bytes_per_token > 0) p.pool_tokens = p.left_per_gpu_bytes / int64_t(p.kv_bytes_per_token);
    const uint64_t per_seq = p.kv_bytes_per_seq + p.kda_state_per_gpu_bytes_per_seq;
    if (per_seq > 0) p.concurrent_seqs = p.left_per_gpu_bytes / int64_t(per_seq);
  }

  // What the pool figures take for granted, said next to them.
  p.kv_assumptions = {
      "the pool is what is left of --mem-fraction-static x usable memory after this GPU's weights; "
      "activations, CUDA graphs and NCCL buffers live in the other " + fmt("%g", 100 * (1 - in.mem_fraction)) + " %",
      "KV " + std::string(in.kv_dtype_bytes == 1 ? "fp8" : "bf16") + ": " + std::to_string(s.n_mla_layers) +
          " MLA layers x (kv_lora_rank " + std::to_string(s.kv_lora_rank) + " + rope " +
          std::to_string(s.qk_rope_head_dim) + ") per token, the whole latent on " +
          (in.dp_attention ? "the sequence's rank" : "every TP rank (not split)") +
          (s.n_dsa_layers > 0 ? "; plus " + std::to_string(s.n_dsa_layers) + " DSA layers x " +
                                    std::to_string(s.dsa_key_bytes) + " B of indexer key (FP8 + fp32 scale)"
                              : std::string()),
      "pool tokens count the KV alone; concurrent sequences also reserve each sequence's KDA state (" +
          gb(double(p.kda_state_per_gpu_bytes_per_seq)) + " per GPU) and assume every sequence is " +
          with_commas(p.context_length) + " tokens long",
      "no prefix-cache sharing, no CPU offload, page rounding ignored (< 1 page per sequence)",
  };
  if (in.dp_attention)
    p.kv_assumptions.push_back(
        "DP attention: a sequence's MLA pages and KDA state (every head) live on its one rank, but every rank "
        "allocates the whole pool as today and writes only its own sequences' slots and pages, so the " +
        std::to_string(p.tp) + " ranks together hold the figures above, not " + std::to_string(p.tp) +
        " x them (per-rank pools: not yet); no prefix cache under DP attention");

  // ---- the seeds' whole-VM rule.
  p.vm_nominal_bytes = uint64_t(p.total_gpus) * in.gpu.nominal_bytes;
  p.vm_rule_left_bytes = int64_t(kVmRuleFraction * double(p.vm_nominal_bytes)) - int64_t(p.checkpoint_bytes);

  // ---- verdict.
  p.fits = true;
  if (!p.tp_check.ok) {
    p.fits = false;
    p.reasons.push_back("TP " + std::to_string(p.tp) + " is not valid: " + p.tp_check.why +
                        " (TP must divide " + std::to_string(p.tp_gcd) + ")");
  }
  if (p.left_per_gpu_bytes <= 0) {
    p.fits = false;
    p.reasons.push_back("weights need " + gb(double(p.weights_per_gpu_bytes)) + " per GPU but " +
                        fmt("%g", in.mem_fraction) + " x " + gb(double(p.usable_per_gpu_bytes)) + " = " +
                        gb(double(p.budget_per_gpu_bytes)) + " is available");
  }
  if (in.dp_attention && p.left_per_gpu_bytes <= 0)
    p.reasons.push_back("DP attention holds " + gb(double(tp_bytes + rep_bytes)) +
                        " of attention, dense, shared-expert, router and vocabulary weights whole on every GPU, and " +
                        gb(double(ep_share)) + " of routed experts");
  if (p.vm_rule_left_bytes <= 0)
    p.reasons.push_back("whole-machine rule: 92 % of " + gb(double(p.vm_nominal_bytes)) + " = " +
                        gb(kVmRuleFraction * double(p.vm_nominal_bytes)) + " is less than the " +
                        gb(double(p.checkpoint_bytes)) + " checkpoint");
  if (p.fits) {
    p.reasons.push_back(gb(double(p.left_per_gpu_bytes)) + " per GPU left for the KV pool and KDA state after " +
                        gb(double(p.weights_per_gpu_bytes)) + " of weights");
    if (p.concurrent_seqs == 0)
      p.reasons.push_back("warning: one " + with_commas(p.context_length) + "-token sequence needs " +
                          gb(double(p.kv_bytes_per_seq)) + " of KV per GPU; the pool holds " +
                          with_commas(p.pool_tokens) + " tokens, so full-length requests cannot all be resident");
  }
  if (s.n_experts > 0 && p.ep > 0 && s.n_experts % p.ep != 0)
    p.reasons.push_back("warning: " + std::to_string(s.n_experts) + " experts do not split evenly over EP " +
                        std::to_string(p.ep) + "; the busiest rank holds " + std::to_string(p.experts_per_gpu));
  p.cost_per_hour = in.price_per_gpu_hour * p.total_gpus;
  return p;
}

std::string format_plan_table(const Plan& p) {
  const PlanInputs& in = p.in;
  const PlanModelShape& s = in.shape;
  std::ostringstream o;
  auto row = [&](const std::string& label, const std::string& value) {
    char buf[256];
    std::snprintf(buf, sizeof buf, "  %-44s %s\n", label.c_str(), value.c_str());
    o << buf;
  };
  o << "model            : " << s.name << "\n";
  o << "cluster          : " << in.nodes << " x " << in.gpus_per_node << " " << in.gpu.label << " = "
    << p.total_gpus << " GPUs, TP " << p.tp << " x EP " << p.ep
    << (p.pp > 1 ? " x PP " + std::to_string(p.pp) : std::string())
    << (in.dp_attention ? ", DP attention (each rank attention for its own sequences)" : "") << "\n";
  o << "context length   : " << with_commas(p.context_length) << " tokens, KV cache "
    << (in.kv_dtype_bytes == 1 ? "fp8" : "bf16") << "\n\n";

  o << "Weights (" << in.weights.note << ")\n";
  char buf[256];
  std::snprintf(buf, sizeof buf, "  %-44s %-10s %16s\n", "group", "shard", "total");
  o << buf;
  for (const auto& g : in.weights.groups) {
    std::snprintf(buf, sizeof buf, "  %-44s %-10s %16s%s\n", g.name.c_str(), shard_name(g.shard),
                  gb(double(g.bytes)).c_str(), g.estimated ? "  (estimated: config lacks its sizes)" : "");
    o << buf;
  }
  std::snprintf(buf, sizeof buf, "  %-44s %-10s %16s%s\n", "safetensors headers", "-",
                gb(double(in.weights.file_overhead_bytes)).c_str(), in.weights.exact ? "" : "  (estimated)");
  o << buf;
  row("total (the download)", with_commas(int64_t(p.checkpoint_bytes)) + " bytes (" +
                                  gb(double(p.checkpoint_bytes)) + ")");
  row((in.dp_attention ? "per GPU under DP attention " : "per GPU under TP ") + std::to_string(p.tp) + " x EP " +
          std::to_string(p.ep),
      gb(double(p.weights_per_gpu_bytes)) +
          (s.n_experts > 0 ? " (" + std::to_string(p.experts_per_gpu) + " of " + std::to_string(s.n_experts) +
                                 " experts per GPU)"
                           : ""));

  o << format_pipeline(p);

  o << "\nTensor parallel (TP must divide " << s.n_heads << " heads and hidden " << s.hidden
    << (s.n_kda_layers > 0 ? " and " + std::to_string(s.kda_heads) + " KDA heads" : "") << ")\n";
  std::string valid;
  for (int t : p.valid_tp) valid += (valid.empty() ? "" : ", ") + std::to_string(t);
  row("gcd = " + std::to_string(p.tp_gcd) + ": valid TP sizes", valid);
  for (const auto& c : p.invalid_examples) row("TP " + std::to_string(c.tp) + " fails", c.why);
  row("TP " + std::to_string(p.tp) + " (this cluster)",
      !p.tp_check.ok     ? "INVALID: " + p.tp_check.why
      : in.dp_attention ? "valid (DP attention: attention and vocabulary whole on every rank)"
                         : "valid");

  o << "\nMemory per GPU (" << in.gpu.name << ": " << in.gpu.usable_source << ")\n";
  row("usable", gb(double(p.usable_per_gpu_bytes)) + gib(double(p.usable_per_gpu_bytes)));
  row("x mem-fraction " + fmt("%g", in.mem_fraction), gb(double(p.budget_per_gpu_bytes)));
  row("- weights", gb(double(p.weights_per_gpu_bytes)));
  row("= left for KV pool + KDA state", gb(double(p.left_per_gpu_bytes)));
  row("outside the fraction (activations, graphs)", gb(double(p.reserve_per_gpu_bytes)));

  o << "\nCaches\n";
  row("KV per token (" + std::to_string(s.n_mla_layers) + " MLA layers x " +
          std::to_string(s.kv_lora_rank + s.qk_rope_head_dim) + " x " + std::to_string(in.kv_dtype_bytes) + " B" +
          (s.n_dsa_layers > 0 ? " + " + std::to_string(s.n_dsa_layers) + " x " + std::to_string(s.dsa_key_bytes) +
                                    " B indexer keys"
                              : std::string()) +
          ")",
      with_commas(int64_t(p.kv_bytes_per_token)) +
          (in.dp_attention ? " bytes, on the sequence's own rank (DP attention)" : " bytes, on every TP rank"));
  row("KV per sequence at " + with_commas(p.context_length),
      gb(double(p.kv_bytes_per_seq)) + gib(double(p.kv_bytes_per_seq)));
  if (s.n_kda_layers > 0) {
    row("KDA state per sequence (" + std::to_string(s.n_kda_layers) + " layers)",
        gb(double(p.kda_state_bytes_per_seq)) + gib(double(p.kda_state_bytes_per_seq)) +
            "; S alone " + gb(double(p.kda_recurrent_bytes_per_seq)));
    row(in.dp_attention ? "  per GPU (whole: DP attention)"
                        : "  per GPU (split by heads over TP " + std::to_string(p.tp) + ")",
        gb(double(p.kda_state_per_gpu_bytes_per_seq)));
  }
  row("KV pool if all left memory is KV", with_commas(p.pool_tokens) + " tokens");
  row("concurrent sequences at " + with_commas(p.context_length), with_commas(p.concurrent_seqs));
  o << "  assumptions:\n";
  for (const auto& a : p.kv_assumptions) o << "    - " << a << "\n";

  o << "\nWhole machine (the seeds' rule: 92 % of memory - checkpoint)\n";
  row(std::to_string(p.total_gpus) + " x " + gb(double(in.gpu.nominal_bytes)),
      gb(double(p.vm_nominal_bytes)) + ": " +
          (p.vm_rule_left_bytes > 0 ? "fits, about " + gb(double(p.vm_rule_left_bytes)) + " left"
                                    : "does not fit (" + gb(double(p.vm_rule_left_bytes)) + ")"));

  o << "\nRESULT: " << (p.fits ? "FITS" : "DOES NOT FIT") << "\n";
  for (const auto& r : p.reasons) o << "  - " << r << "\n";
  if (in.price_per_gpu_hour > 0)
    o << "cost             : " << p.total_gpus << " GPUs x $" << fmt("%.2f", in.price_per_gpu_hour) << " = $"
      << fmt("%.2f", p.cost_per_hour) << " per hour\n";
  return o.str();
}

json plan_to_json(const Plan& p) {
  const PlanInputs& in = p.in;
  json groups = json::array();
  for (const auto& g : in.weights.groups)
    groups.push_back({{"name", g.name}, {"shard", shard_name(g.shard)}, {"bytes", g.bytes},
                      {"tensors", g.n_tensors}, {"estimated", g.estimated}});
  json invalid = json::array();
  for (const auto& c : p.invalid_examples) invalid.push_back({{"tp", c.tp}, {"why", c.why}});
  json out = {
      {"model", in.shape.name},
      {"gpu", in.gpu.name},
      {"gpus_per_node", in.gpus_per_node},
      {"nodes", in.nodes},
      {"total_gpus", p.total_gpus},
      {"tp", p.tp},
      {"ep", p.ep},
      {"pp", p.pp},
      {"pipeline", pipeline_to_json(p.pipeline)},
      {"context_length", p.context_length},
      {"kv_dtype", in.kv_dtype_bytes == 1 ? "fp8" : "bf16"},
      {"mem_fraction", in.mem_fraction},
      {"weights", {{"exact", in.weights.exact}, {"source", in.weights.note}, {"groups", groups},
                   {"file_overhead_bytes", in.weights.file_overhead_bytes},
                   {"total_bytes", p.checkpoint_bytes}, {"per_gpu_bytes", p.weights_per_gpu_bytes},
                   {"experts_per_gpu", p.experts_per_gpu}}},
      {"tensor_parallel", {{"gcd", p.tp_gcd}, {"valid", p.valid_tp}, {"invalid_examples", invalid},
                           {"chosen_valid", p.tp_check.ok}, {"chosen_why", p.tp_check.why}}},
      {"memory_per_gpu", {{"usable_bytes", p.usable_per_gpu_bytes}, {"usable_source", in.gpu.usable_source},
                          {"budget_bytes", p.budget_per_gpu_bytes}, {"left_bytes", p.left_per_gpu_bytes},
                          {"reserve_bytes", p.reserve_per_gpu_bytes}}},
      {"cache", {{"kv_bytes_per_token", p.kv_bytes_per_token}, {"kv_bytes_per_sequence", p.kv_bytes_per_seq},
                 {"kda_state_bytes_per_sequence", p.kda_state_bytes_per_seq},
                 {"kda_recurrent_bytes_per_sequence", p.kda_recurrent_bytes_per_seq},
                 {"kda_state_per_gpu_bytes_per_sequence", p.kda_state_per_gpu_bytes_per_seq},
                 {"pool_tokens", p.pool_tokens}, {"concurrent_sequences", p.concurrent_seqs},
                 {"assumptions", p.kv_assumptions}}},
      {"vm_rule", {{"nominal_bytes", p.vm_nominal_bytes}, {"fraction", kVmRuleFraction},
                   {"left_bytes", p.vm_rule_left_bytes}, {"fits", p.vm_rule_left_bytes > 0}}},
      {"fits", p.fits},
      {"reasons", p.reasons},
      {"price_per_gpu_hour", in.price_per_gpu_hour},
      {"cost_per_hour", p.cost_per_hour},
  };
  if (in.dp_attention) out["dp_attention"] = true;  // absent otherwise: the default output as before
  return out;
}

Result<LoadedModel> load_plan_model(const std::string& model) {
  LoadedModel m;
  if (model == "kimi-k3.1-pro") {
    m.shape = MR_TRY(plan_shape_from_config(kimi_k31_pro_config(), "kimi-k3.1-pro"));
    m.weights = weight_bytes_from_config(m.shape);
    return m;
  }
  if (model == "kimi-k3") {
    json cfg = json::parse(kimi_k3_config_json(), nullptr, false);
    MR_CHECK(!cfg.is_discarded()) << "built-in kimi-k3 config does not parse";
    m.shape = MR_TRY(plan_shape_from_config(cfg, "kimi-k3"));
    m.weights = weight_bytes_from_config(m.shape);
    return m;
  }
  std::error_code ec;
  fs::path path(model);
  // "org/name[@revision]" that is not a local path: the snapshot in the Hugging Face cache.
  if (!fs::exists(path, ec) && model.find('/') != std::string::npos && model.front() != '/' && model.front() != '.') {
    auto snapshot = resolve_model_path(model);
    if (snapshot.is_ok()) path = *snapshot;
  }
  fs::path config_path = fs::is_directory(path, ec) ? path / "config.json" : path;
  if (!fs::exists(config_path, ec))
    return not_found(model + ": not 'kimi-k3' or 'kimi-k3.1-pro', a config.json file, a checkpoint directory with a config.json, "
                             "or a repo id in the local Hugging Face cache");
  std::ifstream f(config_path);
  json cfg = json::parse(f, nullptr, false);
  if (cfg.is_discarded()) return invalid_argument(config_path.string() + ": not valid JSON");
  m.shape = MR_TRY(plan_shape_from_config(cfg, model));
  bool has_shards = false;
  if (fs::is_directory(path, ec)) {
    has_shards = fs::exists(path / "model.safetensors.index.json", ec);
    for (const auto& e : fs::directory_iterator(path, ec))
      if (e.path().extension() == ".safetensors") has_shards = true;
  }
  if (has_shards) {
    m.weights = MR_TRY(weight_bytes_from_checkpoint(path.string(), &m.shape.config));
  } else {
    m.weights = weight_bytes_from_config(m.shape);
  }
  return m;
}

}  // namespace moonrun::tools
