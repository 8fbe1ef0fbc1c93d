// `moonrun make-demo-model --out DIR`: writes the embedded demo model (demo_model.h).
// CMake runs it at build time into build/demo-model, so no weights live in git.
#include <cstdio>
#include <string>

#include "cli/commands.h"
#include "model/demo_model.h"

namespace moonrun::cli {

namespace {
// Base (BPE) ranks of the demo vocabulary when no tokenizer is written.
constexpr int kDemoBaseTokens = 1024;
}  // namespace

void add_make_demo_model_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("make-demo-model",
                                 "Write the small K3-shaped demo checkpoint (random weights, fixed seed)");
  auto out = std::make_shared<std::string>();
  cmd->add_option("--out", *out, "output directory")->required();
  cmd->callback([out] {
    Status st = write_demo_model(*out, kDemoBaseTokens);
    if (!st.is_ok()) {
      std::fprintf(stderr, "moonrun make-demo-model: %s\n", st.message().c_str());
      throw CLI::RuntimeError(1);
    }
  });
}

}  // namespace moonrun::cli
