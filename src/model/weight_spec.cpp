#include "model/weight_spec.h"

#include "model/families.h"

namespace moonrun {

const char* shard_rule_name(ShardRule rule) {
  switch (rule) {
    case ShardRule::replicated: return "replicated";
    case ShardRule::column: return "column";
    case ShardRule::row: return "row";
    case ShardRule::expert: return "expert";
    case ShardRule::vocab: return "vocab";
  }
  return "?";
}

int64_t TensorSpec::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

uint64_t TensorSpec::nbytes() const { return static_cast<uint64_t>(numel()) * dtype_size_bytes(dtype); }

TensorNames::TensorNames(const ModelConfig& cfg)
    : prefix_(cfg.tensor_prefix), lm_head_(cfg.lm_head_name), deepseek_(cfg.family == Family::kimi_k2) {}

std::string TensorNames::expert(int layer_idx, int e, ExpertMatrix m, const std::string& part) const {
  if (deepseek_) {  // DeepseekV3MoE: mlp.experts.E.{gate,up,down}_proj
    const char* w = m == ExpertMatrix::w1 ? "gate_proj" : m == ExpertMatrix::w2 ? "down_proj" : "up_proj";
    return layer(layer_idx, "mlp.experts." + std::to_string(e) + "." + w + "." + part);
  }
  const char* w = m == ExpertMatrix::w1 ? "w1" : m == ExpertMatrix::w2 ? "w2" : "w3";
  return layer(layer_idx, "block_sparse_moe.experts." + std::to_string(e) + "." + w + "." + part);
}

std::vector<std::string> expert_parts(ExpertQuant quant) {
  switch (quant) {
    case ExpertQuant::none: return {"weight"};
    case ExpertQuant::mxfp4_packed: return {"weight_packed", "weight_scale"};
    case ExpertQuant::mxfp4_gpt_oss: return {"weight_blocks", "weight_scales"};
    case ExpertQuant::int4_g32_sym: return {"weight_packed", "weight_scale", "weight_shape"};
  }
  return {};
}

namespace {

// Records what the listing asks for, in the release's storage.
class SpecCollector final : public WeightSink {
 public:
  explicit SpecCollector(const ModelConfig& cfg) : cfg_(cfg), names_(cfg) {}
  void matrix(Matrix&, const std::string& name, int out, int in, ShardRule rule) override {
    out_.push_back({name, DType::BF16, {out, in}, rule});
  }
  void f32(Tensor&, const std::string& name, DType stored, const std::vector<int64_t>& shape, int64_t, int64_t,
           ShardRule rule) override {
    out_.push_back({name, stored, shape, rule});
  }
  void experts(ExpertMatrices&, int layer, ExpertMatrix which, int num_experts, int out, int in) override {
    const auto parts = expert_parts(cfg_.expert_quant);
    for (int e = 0; e < num_experts; ++e) {
      switch (cfg_.expert_quant) {
        case ExpertQuant::none:
          out_.push_back({names_.expert(layer, e, which, parts[0]), DType::BF16, {out, in}, ShardRule::expert, e});
          break;
        case ExpertQuant::mxfp4_packed:
          out_.push_back({names_.expert(layer, e, which, parts[0]), DType::U8, {out, in / 2}, ShardRule::expert, e});
          out_.push_back({names_.expert(layer, e, which, parts[1]), DType::U8, {out, in / 32}, ShardRule::expert, e});
          break;
        case ExpertQuant::mxfp4_gpt_oss:
          out_.push_back({names_.expert(layer, e, which, parts[0]), DType::U8, {out, in / 32, 16}, ShardRule::expert, e});
          out_.push_back({names_.expert(layer, e, which, parts[1]), DType::U8, {out, in / 32}, ShardRule::expert, e});
          break;
        case ExpertQuant::int4_g32_sym:
          // compressed-tensors pack-quantized: eight u4 (q + 8) per int32 along the input,
          // a bf16 scale per 32 inputs, and the unpacked shape [out, in] as int64.
          out_.push_back({names_.expert(layer, e, which, parts[0]), DType::I32, {out, in / 8}, ShardRule::expert, e});
          out_.push_back({names_.expert(layer, e, which, parts[1]), DType::BF16, {out, in / 32}, ShardRule::expert, e});
          out_.push_back({names_.expert(layer, e, which, parts[2]), DType::I64, {2}, ShardRule::expert, e});
          break;
      }
    }
  }
  std::vector<TensorSpec> take() { return std::move(out_); }

 private:
  const ModelConfig& cfg_;
  TensorNames names_;
  std::vector<TensorSpec> out_;
};

}  // namespace

std::vector<TensorSpec> weight_spec(const ModelConfig& cfg) {
  SpecCollector collector(cfg);
  model_family(cfg.family).describe(cfg, collector);  // the family's one listing
  return collector.take();
}

bool is_alternative_shape(const TensorSpec& t, const std::vector<int64_t>& stored) {
  const std::string suffix = ".A_log";
  if (t.name.size() < suffix.size() || t.name.compare(t.name.size() - suffix.size(), suffix.size(), suffix) != 0)
    return false;
  int64_t n = 1, non_unit = 0;
  for (int64_t d : stored) {
    n *= d;
    if (d != 1) ++non_unit;
  }
  return n == t.numel() && non_unit <= 1;
}

Result<ShardBlock> dense_shard(const std::string& name, ShardRule rule, int64_t rows, int64_t cols,
                               const ParallelRank& p) {
  ShardBlock b{0, rows, 0, cols};
  if (p.world == 1 || p.dp_attention || rule == ShardRule::replicated || rule == ShardRule::expert) return b;
  const bool split_rows = (rule == ShardRule::column || rule == ShardRule::vocab) && rows > 1;
  const int64_t extent = split_rows ? rows : cols;
  if (extent % p.world != 0)
    return invalid_argument(name + ": " + std::to_string(extent) + " " + shard_rule_name(rule) +
                            " elements do not split evenly over " + std::to_string(p.world) + " ranks");
  const int64_t part = extent / p.world;
  if (split_rows) b.r0 = p.rank * part, b.r1 = b.r0 + part;
  else b.c0 = p.rank * part, b.c1 = b.c0 + part;
  return b;
}

uint64_t rank_tensor_bytes(const TensorSpec& t, const ParallelRank& p, int num_experts) {
  if (p.world == 1 || t.shard == ShardRule::replicated) return t.nbytes();
  if (t.shard == ShardRule::expert) {
    const int per_group = num_experts / p.ep;
    const int first = p.ep_rank() * per_group;
    if (t.expert < first || t.expert >= first + per_group) return 0;
    return t.nbytes() / static_cast<uint64_t>(p.moe_tp());
  }
  return p.dp_attention ? t.nbytes() : t.nbytes() / static_cast<uint64_t>(p.world);
}

uint64_t rank_weight_bytes(const ModelConfig& cfg, const ParallelRank& p) {
  uint64_t total = 0;
  for (const TensorSpec& t : weight_spec(cfg)) total += rank_tensor_bytes(t, p, cfg.num_experts);
  return total;
}

}  // namespace moonrun
