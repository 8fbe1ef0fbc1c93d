// Kimi K3.1-Pro's config, derived from the published K3 config (see kimi_k3_config.h).
#include "tools/kimi_k3_config.h"

namespace moonrun::tools {

nlohmann::json kimi_k31_pro_config() {
  nlohmann::json c = nlohmann::json::parse(kimi_k3_config_json());
  c["_provenance"] =
      "Kimi K3.1-Pro as the public card describes it (issue 38): the published K3 config.json with the K3.1 "
      "architecture name and a dsa_config naming the 24 full-attention layers (indexer 32 heads x 128, top 2048). "
      "model_type and the dsa_config key names are not confirmed against a released config.json.";
  c["architectures"] = {"KimiK31ForConditionalGeneration"};
  c["model_type"] = "kimi_k31";
  nlohmann::json& tc = c["text_config"];
  tc["dsa_config"] = {
      {"dsa_layers", tc["linear_attn_config"]["full_attn_layers"]},
      {"index_n_heads", 32},
      {"index_head_dim", 128},
      {"index_topk", 2048},
  };
  return c;
}

}  // namespace moonrun::tools
