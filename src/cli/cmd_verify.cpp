// `moonrun verify [PATH] [--hash] [--write-manifest] [--json]`: is the checkpoint complete
// and intact? Prints the seed's block report (or JSON) on stdout.
// Exit codes: 0 COMPLETE, 1 INCOMPLETE or corrupt (problems listed), 2 usage error (the
// model does not resolve, bad flags).
#include <cstdio>
#include <memory>
#include <thread>

#include "cli/commands.h"
#include "tools/verify.h"

namespace moonrun::cli {

void add_verify_command(CLI::App& app) {
  auto opts = std::make_shared<VerifyOptions>();
  auto positional = std::make_shared<std::string>();
  auto json = std::make_shared<bool>(false);
  auto write = std::make_shared<bool>(false);
  auto* cmd = app.add_subcommand(
      "verify",
      "Check that a checkpoint is complete before serving it: shards present, headers valid, "
      "tensors as config.json implies, no unfinished downloads; --hash also checks content hashes");
  cmd->add_option("path", *positional, "checkpoint directory or org/name[@revision] (same as --model-path)");
  cmd->add_option("--model-path,--model", opts->model,
                  "checkpoint directory, or a Hugging Face repo id org/name[@revision] in the local "
                  "HF cache ($HF_HUB_CACHE, $HF_HOME/hub or ~/.cache/huggingface/hub)");
  cmd->add_flag("--hash", opts->hash,
                "recompute every file's SHA-256 (or git blob id) and compare it with its reference: the HF "
                "cache's blob name, `hf download --local-dir` metadata, or moonrun-manifest.json; reads every byte");
  cmd->add_flag("--write-manifest", *write,
                "after the checks pass, write moonrun-manifest.json (SHA-256 and size of every file) into a "
                "local directory, for later --hash runs");
  cmd->add_flag("--json", *json, "print the report as JSON");
  opts->hash_threads = static_cast<int>(std::min(4u, std::max(1u, std::thread::hardware_concurrency())));
  cmd->add_option("--hash-jobs", opts->hash_threads, "files hashed in parallel")
      ->check(CLI::Range(1, 256))
      ->capture_default_str();
  cmd->callback([opts, positional, json, write] {
    if (!positional->empty()) {
      if (!opts->model.empty() && opts->model != *positional) {
        std::fprintf(stderr, "moonrun verify: the checkpoint is given twice ('%s' and --model-path '%s')\n",
                     positional->c_str(), opts->model.c_str());
        throw CLI::RuntimeError(2);
      }
      opts->model = *positional;
    }
    if (opts->model.empty()) {
      std::fprintf(stderr, "moonrun verify: give the checkpoint: `moonrun verify PATH` (a directory or org/name)\n");
      throw CLI::RuntimeError(2);
    }
    auto report = verify_checkpoint(*opts);
    if (!report) {
      std::fprintf(stderr, "moonrun verify: %s\n", report.status().message().c_str());
      throw CLI::RuntimeError(2);
    }
    if (*write) {
      if (!report->complete()) {
        std::fprintf(stderr, "moonrun verify: not writing a manifest for a checkpoint with problems\n");
      } else if (Status st = write_manifest(*report, *opts); !st.is_ok()) {
        std::fprintf(stderr, "moonrun verify: %s\n", st.message().c_str());
        throw CLI::RuntimeError(st.code() == StatusCode::kInvalidArgument ? 2 : 1);
      }
    }
    if (*json) {
      std::printf("%s\n", verify_report_to_json(*report).dump(2).c_str());
    } else {
      std::fputs(format_verify_report(*report).c_str(), stdout);
      if (!report->manifest_written.empty()) std::printf("manifest written : %s\n", report->manifest_written.c_str());
    }
    std::fflush(stdout);
    if (!report->complete()) throw CLI::RuntimeError(1);
  });
}

}  // namespace moonrun::cli
