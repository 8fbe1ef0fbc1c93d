#include "model/families.h"

#include "model/kimi_k2.h"
#include "model/kimi_k3.h"
#include "model/kimi_k31.h"
#include "model/loader.h"

namespace moonrun {

namespace {

void describe_k3(const ModelConfig& cfg, WeightSink& sink) {
  KimiK3Weights scratch;  // a listing sink writes into it; weight_spec's allocates nothing
  describe_kimi_k3_weights(cfg, scratch, sink);
}

void describe_k2(const ModelConfig& cfg, WeightSink& sink) {
  KimiK2Weights scratch;
  describe_kimi_k2_weights(cfg, scratch, sink);
}

void describe_k31(const ModelConfig& cfg, WeightSink& sink) {
  KimiK31Weights scratch;
  describe_kimi_k31_weights(cfg, scratch, sink);
}

WeightLayout weight_layout(const LoadOptions& o) { return {o.stage, o.split_router, o.split_latent_moe, o.split_latent_moe && o.split_latent_up}; }
TensorParallel tensor_parallel(const LoadOptions& o) {
  // DP attention: the heads, the vocabulary and the dense MLPs whole on every rank (a
  // tensor-parallel size of one); only the routed experts are the group's.
  if (o.dp_attention && o.world_size > 1) return {o.rank, 1, false, false, false, true};
  const bool split = o.world_size > 1;
  return {o.rank, o.world_size, o.split_router && split, o.split_latent_moe && split,
          o.split_latent_moe && o.split_latent_up && split};
}

// kimi_k3 and kimi_linear share one forward (config.json's fields tell them apart).
Result<std::unique_ptr<Model>> build_k3(Ops& ops, const Checkpoint& ckpt, const ModelConfig& cfg,
                                        const LoadOptions& options) {
  WeightLoader loader(ops, ckpt, cfg, options);
  uint64_t total = 0;
  for (const TensorSpec& t : weight_spec(cfg)) total += t.nbytes();
  loader.set_total_bytes(total / static_cast<uint64_t>(options.world_size * options.stage.num_stages));
  const size_t before = ops.allocated_bytes();
  KimiK3Weights weights;
  describe_kimi_k3_weights(cfg, weights, loader, weight_layout(options));
  MR_RETURN_IF_ERROR(loader.finish());
  ops.synchronize();
  return std::unique_ptr<Model>(new KimiK3(cfg, std::move(weights), ops.allocated_bytes() - before,
                                           tensor_parallel(options), {}, options.stage));
}

// K3.1: K3's forward with a DSA layer in each full-attention layer (model/kimi_k31.h). The
// DSA ops exist on the CPU only; CUDA throws by name at the first DSA layer.
Result<std::unique_ptr<Model>> build_k31(Ops& ops, const Checkpoint& ckpt, const ModelConfig& cfg,
                                         const LoadOptions& options) {
  WeightLoader loader(ops, ckpt, cfg, options);
  uint64_t total = 0;
  for (const TensorSpec& t : weight_spec(cfg)) total += t.nbytes();
  loader.set_total_bytes(total / static_cast<uint64_t>(options.world_size * options.stage.num_stages));
  const size_t before = ops.allocated_bytes();
  KimiK31Weights weights;
  describe_kimi_k31_weights(cfg, weights, loader, weight_layout(options));
  MR_RETURN_IF_ERROR(loader.finish());
  ops.synchronize();
  auto model = std::make_unique<KimiK3>(cfg, std::move(weights.k3), ops.allocated_bytes() - before,
                                        tensor_parallel(options), std::move(weights.indexers), options.stage);
  model->set_index_cache_dtype(options.index_cache_dtype);
  return std::unique_ptr<Model>(std::move(model));
}

// The K2 forward runs on the CPU backend and on CUDA, with bf16 experts or the released
// checkpoints' INT4 pack-quantized ones (the CPU's moe_experts dequantises them on the fly,
// CUDA's in registers: moe/expert_linear.cu). kimi_k25's vision tower is K3's MoonViT in its
// K2.5 options (model/vision/moonvit.h), listed with the first stage's weights.
Result<std::unique_ptr<Model>> build_k2(Ops& ops, const Checkpoint& ckpt, const ModelConfig& cfg,
                                        const LoadOptions& options) {
  if (cfg.expert_quant != ExpertQuant::none && cfg.expert_quant != ExpertQuant::int4_g32_sym)
    return unimplemented(ckpt.dir() + ": the K2 forward with " + expert_quant_name(cfg.expert_quant) +
                         " experts is not built (K2 checkpoints carry bf16 or INT4 experts)");
  WeightLoader loader(ops, ckpt, cfg, options);
  uint64_t total = 0;
  for (const TensorSpec& t : weight_spec(cfg)) total += t.nbytes();
  loader.set_total_bytes(total / static_cast<uint64_t>(options.world_size * options.stage.num_stages));
  const size_t before = ops.allocated_bytes();
  KimiK2Weights weights;
  describe_kimi_k2_weights(cfg, weights, loader, weight_layout(options));
  MR_RETURN_IF_ERROR(loader.finish());
  ops.synchronize();
  return std::unique_ptr<Model>(new KimiK2(ops, cfg, std::move(weights), ops.allocated_bytes() - before,
                                           tensor_parallel(options), options.max_positions,
                                           options.stage));
}

std::string known_names() {
  std::string s;
  for (const ModelFamilyRow& row : model_families())
    for (const auto& [type, arch] : row.names) s += (s.empty() ? "" : ", ") + type + " (" + arch + ")";
  return s;
}

}  // namespace

const std::vector<ModelFamilyRow>& model_families() {
  static const std::vector<ModelFamilyRow> rows = {
      {Family::kimi_k3, "kimi_k3", {{"kimi_k3", "KimiK3ForConditionalGeneration"}}, "kimi_k3",
       parse_kimi_k3_config, describe_k3, build_k3, nullptr},
      {Family::kimi_linear, "kimi_linear", {{"kimi_linear", "KimiLinearForCausalLM"}}, "kimi_k2",
       parse_kimi_linear_config, describe_k3, build_k3, nullptr},
      // The K2 generation: DeepSeek-V3's layout. deepseek_v3 is the class's own model_type
      // (checkpoints converted without Moonshot's config); kimi_k25 nests it in text_config.
      {Family::kimi_k2, "kimi_k2",
       {{"kimi_k2", "DeepseekV3ForCausalLM"},
        {"kimi_k25", "KimiK25ForConditionalGeneration"},
        {"deepseek_v3", "DeepseekV3ForCausalLM"}},
       "kimi_k2", parse_kimi_k2_config, describe_k2, build_k2, nullptr},
      // K3.1: K3 + DeepSeek Sparse Attention in the full-attention layers (issue 38). The
      // architecture is the card's; the model_type "kimi_k31" is this table's guess (no public
      // K3.1 config.json could be read), matched by either name. K3's chat format (issue 38:
      // "the chat format and parsers as K3's").
      {Family::kimi_k31, "kimi_k31", {{"kimi_k31", "KimiK31ForConditionalGeneration"}}, "kimi_k3",
       parse_kimi_k31_config, describe_k31, build_k31, nullptr},
  };
  return rows;
}

const ModelFamilyRow& model_family(Family family) {
  for (const ModelFamilyRow& row : model_families())
    if (row.family == family) return row;
  return model_families().front();
}

std::string architecture_of(const nlohmann::json& config) {
  if (!config.is_object() || !config.contains("architectures")) return "";
  const auto& a = config["architectures"];
  if (!a.is_array() || a.empty() || !a[0].is_string()) return "";
  return a[0].get<std::string>();
}

Result<const ModelFamilyRow*> find_model_family(const nlohmann::json& config, const std::string& source) {
  if (!config.is_object()) return failed_precondition(source + ": the top level must be a JSON object");
  std::string model_type;
  if (config.contains("model_type") && !config["model_type"].is_null()) {
    if (!config["model_type"].is_string())
      return failed_precondition(source + ": model_type must be a string, got " + config["model_type"].dump());
    model_type = config["model_type"].get<std::string>();
  }
  const std::string arch = architecture_of(config);
  const ModelFamilyRow* by_type = nullptr;
  const ModelFamilyRow* by_arch = nullptr;
  for (const ModelFamilyRow& row : model_families())
    for (const auto& [type, a] : row.names) {
      if (!model_type.empty() && type == model_type && !by_type) by_type = &row;
      if (!arch.empty() && a == arch && !by_arch) by_arch = &row;
    }
  if (!model_type.empty()) {
    if (!by_type)
      return failed_precondition(source + ": model_type \"" + model_type +
                                 "\" is not supported (moonrun runs " + known_names() + ")");
    if (by_arch && by_arch != by_type)
      return failed_precondition(source + ": architectures[0] \"" + arch + "\" is a " + by_arch->name +
                                 " class but model_type \"" + model_type + "\" is " + by_type->name);
    return by_type;
  }
  if (by_arch) return by_arch;
  if (!arch.empty())
    return failed_precondition(source + ": architecture \"" + arch + "\" is not supported and model_type is missing "
                                        "(moonrun runs " + known_names() + ")");
  return failed_precondition(source + ": model_type and architectures are missing (moonrun runs " + known_names() +
                             ")");
}

}  // namespace moonrun
