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
  moonrun::cli::add_bench_model_command(app);
  moonrun::cli::add_make_demo_model_command(app);
  moonrun::cli::add_make_slice_command(app);
  moonrun::cli::add_make_train_data_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // A command's own exit code comes as CLI::RuntimeError(code); any other parse error
    // (unknown option, missing value, bad number) is a usage error: exit 2, as commands.h
    // promises, not CLI11's 100+ codes.
    const int code = app.exit(e);
    return (e.get_name() == "RuntimeError" || code == 0) ? code : 2;
  }
  return 0;
}
