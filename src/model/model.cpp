#include "model/model.h"

#include "model/kimi_k3.h"
#include "model/loader.h"

namespace moonrun {

Result<std::unique_ptr<Model>> load_model(Ops& ops, const Checkpoint& ckpt, const LoadOptions& options) {
  const ModelConfig cfg = MR_TRY(parse_model_config(ckpt.config(), ckpt.dir() + "/config.json"));
  if (options.world_size < 1 || options.rank < 0 || options.rank >= options.world_size)
    return invalid_argument("rank " + std::to_string(options.rank) + " of " + std::to_string(options.world_size));
  // kimi_k3 and kimi_linear share one forward (config.json's fields tell them apart).
  WeightLoader loader(ops, ckpt, cfg, options);
  uint64_t total = 0;
  for (const TensorSpec& t : weight_spec(cfg)) total += t.nbytes();
  loader.set_total_bytes(total / static_cast<uint64_t>(options.world_size));
  const size_t before = ops.allocated_bytes();
  KimiK3Weights weights;
  describe_kimi_k3_weights(cfg, weights, loader);
  MR_RETURN_IF_ERROR(loader.finish());
  ops.synchronize();
  return std::unique_ptr<Model>(new KimiK3(cfg, std::move(weights), ops.allocated_bytes() - before));
}

}  // namespace moonrun
