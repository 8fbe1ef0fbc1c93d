// `moonrun generate`: placeholder until its issue lands.
#include <cstdio>

#include "cli/commands.h"

namespace moonrun::cli {

void add_generate_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("generate", "(not yet implemented)");
  cmd->allow_extras();
  cmd->callback([] {
    std::fprintf(stderr, "moonrun generate: not implemented yet\n");
    throw CLI::RuntimeError(2);
  });
}

}  // namespace moonrun::cli
