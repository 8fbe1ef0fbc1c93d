#pragma once
// `moonrun <command>`: each command lives in its own cmd_<name>.cpp and registers itself
// here. A command's callback ends with `throw CLI::RuntimeError(code)` for a non-zero exit.
// Exit codes: 0 ok, 1 the check failed / the run failed, 2 usage or input error.
#include <CLI/CLI.hpp>

#include <string>

#include "common/status.h"

#if __has_include("moonrun_commit.h")
#include "moonrun_commit.h"  // generated at build time (cmake/commit_header.cmake)
#endif
#ifndef MOONRUN_GIT_COMMIT
#define MOONRUN_GIT_COMMIT "unknown"
#endif

namespace moonrun::cli {

void add_generate_command(CLI::App& app);
void add_serve_command(CLI::App& app);
void add_plan_command(CLI::App& app);
void add_verify_command(CLI::App& app);
void add_bench_command(CLI::App& app);
void add_render_command(CLI::App& app);
void add_parse_command(CLI::App& app);
void add_make_demo_model_command(CLI::App& app);
void add_bench_model_command(CLI::App& app);
void add_make_slice_command(CLI::App& app);
void add_make_train_data_command(CLI::App& app);  // and train-tokenizer

inline constexpr const char* kMoonrunVersion = "0.1.0";
inline constexpr const char* kMoonrunCommit = MOONRUN_GIT_COMMIT;  // at build time, "+dirty" if changed

}  // namespace moonrun::cli
