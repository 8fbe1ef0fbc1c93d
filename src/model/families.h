#pragma once
// The model families, one row each (DESIGN.md "Model families"): which config.json names a
// family ("architectures"[0] and model_type), how its config is parsed, how its weights are
// listed (names, stored shapes and dtypes, shard rules), how its forward is built, and which
// chat format its checkpoints speak. Everything that used to ask "is this kimi_k3 or
// kimi_linear?" (load_model, weight_spec, parse_model_config, the chat format, verify) asks
// this table instead; the engine, scheduler, server and chat layers never learn a family's name.
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "model/config.h"
#include "model/model.h"
#include "model/weight_spec.h"

namespace moonrun {

struct ModelFamilyRow {
  Family family;
  const char* name;  // "kimi_k3", "kimi_linear", "kimi_k2"
  // The config.json names that pick this row: a model_type and the architecture class it
  // pairs with (same index), e.g. {"kimi_k2", "DeepseekV3ForCausalLM"}.
  std::vector<std::pair<std::string, std::string>> names;
  const char* chat_format;  // chat::chat_format_from_name's spelling: "kimi_k3" | "kimi_k2"
  // Fills `cfg` (family, model_type and architecture already set) from the whole document.
  Status (*parse)(const nlohmann::json& config, const std::string& source, ModelConfig& cfg);
  // Lists every text-model tensor into `sink` (the loader's or weight_spec()'s).
  void (*describe)(const ModelConfig& cfg, WeightSink& sink);
  // Loads the weights and builds the forward; null while the family's forward is not built
  // (load_model then refuses with `not_built`, one line).
  Result<std::unique_ptr<Model>> (*build)(Ops& ops, const Checkpoint& ckpt, const ModelConfig& cfg,
                                          const LoadOptions& options);
  const char* not_built;
};

// Every row, in the order error messages list them.
const std::vector<ModelFamilyRow>& model_families();
const ModelFamilyRow& model_family(Family family);

// config.json "architectures"[0] ("" when absent or not a list of strings).
std::string architecture_of(const nlohmann::json& config);

// The row for a config.json document: by model_type when present (its architecture, when
// given, must not name another family), else by "architectures"[0]. An unknown or missing
// name is an error naming `source`, the name, and the names moonrun runs.
Result<const ModelFamilyRow*> find_model_family(const nlohmann::json& config, const std::string& source);

}  // namespace moonrun
