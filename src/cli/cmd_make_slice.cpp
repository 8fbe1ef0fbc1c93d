// `moonrun make-slice --config CONFIG --layers kda-dense,kda-moe,mla-moe --out DIR
// [--experts N] [--seed S]`: a K3-layout checkpoint of the listed layers at the config's
// widths (tools/make_slice.h), with a byte-level tokenizer of the config's vocabulary so the
// slice can be served (`moonrun serve`: token-id prompts to /v1/completions).
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "chat/bpe_train.h"
#include "cli/commands.h"
#include "model/demo_model.h"
#include "tools/make_slice.h"

namespace moonrun::cli {

namespace {

// n byte-level BPE tokens a tiktoken ranks file can hold: the 256 bytes, then every 2-byte
// string, then 3-byte strings, each a merge of two lower-ranked tokens (a 2-byte prefix and
// a byte), so the ranks are a valid BPE. The weights are synthetic: only the ids matter.
std::vector<std::string> synthetic_ranks(int n) {
  std::vector<std::string> tokens;
  tokens.reserve(n);
  for (int b = 0; b < 256 && static_cast<int>(tokens.size()) < n; ++b) tokens.push_back(std::string(1, static_cast<char>(b)));
  for (int i = 0; i < 65536 && static_cast<int>(tokens.size()) < n; ++i)
    tokens.push_back({static_cast<char>(i / 256), static_cast<char>(i % 256)});
  for (int i = 0; static_cast<int>(tokens.size()) < n; ++i)
    tokens.push_back({static_cast<char>(i / 65536 % 256), static_cast<char>(i / 256 % 256), static_cast<char>(i % 256)});
  return tokens;
}

Status write_slice_tokenizer(const std::string& dir) {
  std::ifstream in(dir + "/config.json");
  const nlohmann::json cfg = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  const nlohmann::json& text = cfg.contains("text_config") ? cfg["text_config"] : cfg;
  const int vocab = text.value("vocab_size", 0);
  if (vocab <= kNumReservedSpecialTokens) return invalid_argument(dir + "/config.json: no vocab_size for a tokenizer");
  const int base = vocab - kNumReservedSpecialTokens;
  MR_RETURN_IF_ERROR(chat::write_tiktoken_model(dir + "/tiktoken.model", synthetic_ranks(base)));
  std::ofstream(dir + "/tokenizer_config.json") << demo_tokenizer_config(base).dump(1) << "\n";
  return Status::ok();
}

}  // namespace

void add_make_slice_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("make-slice", "Write a few layers of a Kimi model (K3, K3.1, K2) at full width (synthetic weights)");
  auto c = std::make_shared<tools::SliceConfig>();
  auto layers = std::make_shared<std::string>("kda-dense,kda-moe,mla-moe");
  cmd->add_option("--config", c->config_path, "config.json of the model, or kimi-k3 (the published K3 config, built in)")
      ->required();
  cmd->add_option("--layers", *layers, "layer kinds in order: kda-dense, kda-moe, mla-dense, mla-moe (K2: mla only)")
      ->capture_default_str();
  cmd->add_option("--out", c->out_dir, "output directory")->required();
  cmd->add_option("--experts", c->num_experts, "routed experts per MoE layer (default: the config's)");
  cmd->add_option("--seed", c->seed, "synthetic weights' seed")->capture_default_str();
  cmd->callback([c, layers] {
    tools::SliceConfig config = *c;
    std::stringstream ss(*layers);
    for (std::string l; std::getline(ss, l, ',');) config.layers.push_back(l);
    auto r = tools::make_slice(config);
    if (!r.is_ok()) {
      std::fprintf(stderr, "moonrun make-slice: %s\n", r.status().message().c_str());
      throw CLI::RuntimeError(r.status().code() == StatusCode::kInvalidArgument ? 2 : 1);
    }
    const Status tok = write_slice_tokenizer(config.out_dir);
    if (!tok.is_ok()) {
      std::fprintf(stderr, "moonrun make-slice: %s\n", tok.message().c_str());
      throw CLI::RuntimeError(1);
    }
    std::printf("wrote %s: %d tensors, %.2f GB in %d shards, %.1f s (%.2f GB/s); a byte-level tokenizer of the "
                "config's vocabulary\n",
                config.out_dir.c_str(), r->tensors, r->bytes / 1e9, r->shards, r->seconds, r->bytes / 1e9 / r->seconds);
  });
}

}  // namespace moonrun::cli
