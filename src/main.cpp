// moonrun: check a checkpoint, plan the cluster, load it, serve it, measure it.
#include <CLI/CLI.hpp>

#include "cli/commands.h"

int main(int argc, char** argv) {
  CLI::App app{
      "moonrun: serves Kimi K3-family checkpoints (OpenAI-compatible), and the tools around it"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "moonrun 0.1.0");
  moonrun::cli::add_serve_command(app);
  moonrun::cli::add_generate_command(app);
  moonrun::cli::add_render_command(app);
  moonrun::cli::add_parse_command(app);
  moonrun::cli::add_plan_command(app);
  moonrun::cli::add_verify_command(app);
  moonrun::cli::add_bench_command(app);
  moonrun::cli::add_make_demo_model_command(app);
  CLI11_PARSE(app, argc, argv);
  return 0;
}
