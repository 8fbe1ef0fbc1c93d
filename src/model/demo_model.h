#pragma once
// A small random K3-shaped checkpoint (real kimi_k3 config layout and tensor names, MXFP4
// routed experts, grouped routing, two AttnRes blocks, KDA and MLA layers, two safetensors
// shards behind an index) generated deterministically from a fixed seed with our own PRNG,
// so every build on every machine writes the same bytes. Tests and benchmarks build their
// variants from it (`moonrun make-demo-model`). The demo model users get is the trained
// models/moonrun-demo (docs/demo-model.md); its tokenizer config comes from here too.
#include <string>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace moonrun {

// K3 places 256 reserved special tokens right after the base (BPE) ranks.
constexpr int kNumReservedSpecialTokens = 256;

// config.json for a demo model with `n_base_tokens` BPE ranks (vocab = base + 256).
nlohmann::json demo_model_config(int n_base_tokens);

// tokenizer_config.json: the K3 special tokens at their offsets after the base ranks.
nlohmann::json demo_tokenizer_config(int n_base_tokens);

// Writes config.json, tokenizer_config.json, model-0000{1,2}-of-00002.safetensors and
// model.safetensors.index.json into `dir` (created if missing). tiktoken.model is written
// by the caller (the tokenizer's trainer).
Status write_demo_model(const std::string& dir, int n_base_tokens);

}  // namespace moonrun
