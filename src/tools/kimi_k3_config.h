#pragma once
// The published Kimi K3 config.json, built into the binary so `moonrun plan --model kimi-k3`
// works on a laptop with no checkpoint and no ../shared folder beside the clone.
// Source: shared/models/kimi-k3.config.json (a unit test checks the copy is byte-identical
// whenever that file is present).
#include <string_view>

namespace moonrun::tools {

std::string_view kimi_k3_config_json();

}  // namespace moonrun::tools
