// `moonrun make-slice --config CONFIG --layers kda-dense,kda-moe,mla-moe --out DIR
// [--experts N] [--seed S]`: a K3-layout checkpoint of the listed layers at the config's
// widths (tools/make_slice.h).
#include <cstdio>
#include <sstream>

#include "cli/commands.h"
#include "tools/make_slice.h"

namespace moonrun::cli {

void add_make_slice_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("make-slice", "Write a few layers of a Kimi K3-family model at full width (synthetic weights)");
  auto c = std::make_shared<tools::SliceConfig>();
  auto layers = std::make_shared<std::string>("kda-dense,kda-moe,mla-moe");
  cmd->add_option("--config", c->config_path, "config.json of the model, or kimi-k3 (the published K3 config, built in)")
      ->required();
  cmd->add_option("--layers", *layers, "layer kinds in order: kda-dense, kda-moe, mla-dense, mla-moe")
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
    std::printf("wrote %s: %d tensors, %.2f GB in %d shards, %.1f s (%.2f GB/s)\n", config.out_dir.c_str(),
                r->tensors, r->bytes / 1e9, r->shards, r->seconds, r->bytes / 1e9 / r->seconds);
  });
}

}  // namespace moonrun::cli
