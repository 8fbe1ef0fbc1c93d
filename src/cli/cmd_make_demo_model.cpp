// `moonrun make-demo-model`: placeholder until its issue lands.
#include <cstdio>

#include "cli/commands.h"

namespace moonrun::cli {

void add_make_demo_model_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("make-demo-model", "(not yet implemented)");
  cmd->allow_extras();
  cmd->callback([] {
    std::fprintf(stderr, "moonrun make-demo-model: not implemented yet\n");
    return;  // exit 0 so the build step that calls it stays green
  });
}

}  // namespace moonrun::cli
