#include "model/model.h"

#include "model/families.h"

namespace moonrun {

Status check_parallel_split(const ModelConfig& cfg, int tp_size, int ep_size, bool dp_attention) {
  const std::string tp = "--tp-size " + std::to_string(tp_size) + ": ";
  if (tp_size < 1 || ep_size < 1) return invalid_argument("--tp-size and --ep-size must be >= 1");
  if (tp_size % ep_size != 0)
    return invalid_argument("--ep-size " + std::to_string(ep_size) + " must divide --tp-size " + std::to_string(tp_size));
  auto splits = [&](int64_t n, const char* what) -> Status {
    if (n % tp_size == 0 || dp_attention) return Status::ok();  // DP attention: whole on every rank
    return invalid_argument(tp + "the model's " + std::to_string(n) + " " + what + " do not split evenly over " +
                            std::to_string(tp_size) + " ranks");
  };
  if (cfg.num_mla_layers > 0) MR_RETURN_IF_ERROR(splits(cfg.num_attention_heads, "attention heads (num_attention_heads)"));
  if (cfg.num_kda_layers > 0) MR_RETURN_IF_ERROR(splits(cfg.kda_num_heads, "KDA heads (linear_attn_config.num_heads)"));
  MR_RETURN_IF_ERROR(splits(cfg.vocab_size, "vocabulary rows (vocab_size)"));
  if (cfg.num_experts > 0 && cfg.num_experts % ep_size != 0)
    return invalid_argument("--ep-size " + std::to_string(ep_size) + ": the model's " + std::to_string(cfg.num_experts) +
                            " experts do not split evenly over " + std::to_string(ep_size) + " groups");
  return Status::ok();
}

Result<std::unique_ptr<Model>> load_model(Ops& ops, const Checkpoint& ckpt, const LoadOptions& options) {
  const ModelConfig cfg = MR_TRY(parse_model_config(ckpt.config(), ckpt.dir() + "/config.json"));
  const ModelFamilyRow& family = model_family(cfg.family);
  if (!family.build)
    return unimplemented(ckpt.dir() + ": " + (cfg.architecture.empty() ? cfg.model_type : cfg.architecture) + ": " +
                         family.not_built);
  if (options.world_size < 1 || options.rank < 0 || options.rank >= options.world_size)
    return invalid_argument("rank " + std::to_string(options.rank) + " of " + std::to_string(options.world_size));
  MR_RETURN_IF_ERROR(check_parallel_split(cfg, options.world_size, options.ep_size, options.dp_attention));
  return family.build(ops, ckpt, cfg, options);
}

}  // namespace moonrun
