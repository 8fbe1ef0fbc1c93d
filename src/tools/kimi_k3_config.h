#pragma once
// The published Kimi K3 config.json, built into the binary so `moonrun plan --model kimi-k3`
// works on a laptop with no checkpoint and no ../shared folder beside the clone.
// Source: shared/models/kimi-k3.config.json (a unit test checks the copy is byte-identical
// whenever that file is present).
#include <string_view>

#include <nlohmann/json.hpp>

namespace moonrun::tools {

std::string_view kimi_k3_config_json();

// Kimi K3.1-Pro's config for `moonrun plan --model kimi-k3.1-pro` (issue 38): the K3 config
// above with the K3.1 names (KimiK31ForConditionalGeneration, model_type kimi_k31) and a
// text_config.dsa_config listing the 24 full-attention layers, indexer 32 heads x 128, top
// 2048, as the public card describes it. models/kimi-k3.1-pro.config.json is this document
// written out (a unit test checks they agree).
nlohmann::json kimi_k31_pro_config();

}  // namespace moonrun::tools
