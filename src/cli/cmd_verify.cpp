// `moonrun verify --model M [--hash]`: is the checkpoint complete? Prints the seed's block
// report on stdout; exit 0 COMPLETE, 1 INCOMPLETE (problems listed), 2 usage error.
#include <cstdio>
#include <memory>
#include <thread>

#include "cli/commands.h"
#include "tools/verify.h"

namespace moonrun::cli {

void add_verify_command(CLI::App& app) {
  auto opts = std::make_shared<VerifyOptions>();
  auto* cmd = app.add_subcommand(
      "verify",
      "Check that a checkpoint is complete before serving it: shards present, headers valid, "
      "tensors as config.json implies, no unfinished downloads; --hash also checks content hashes");
  cmd->add_option("--model", opts->model,
                  "checkpoint directory, or a Hugging Face repo id org/name[@revision] in the local "
                  "HF cache ($HF_HUB_CACHE, $HF_HOME/hub or ~/.cache/huggingface/hub)");
  cmd->add_flag("--hash", opts->hash,
                "recompute each blob's SHA-256 (or git blob id) and compare it with the name the HF "
                "cache stores it under; reads every byte");
  opts->hash_threads = static_cast<int>(std::min(4u, std::max(1u, std::thread::hardware_concurrency())));
  cmd->add_option("--hash-jobs", opts->hash_threads, "files hashed in parallel")
      ->check(CLI::Range(1, 256))
      ->capture_default_str();
  cmd->callback([opts] {
    if (opts->model.empty()) {
      std::fprintf(stderr, "moonrun verify: --model is required (a checkpoint directory or org/name)\n");
      throw CLI::RuntimeError(2);
    }
    auto report = verify_checkpoint(*opts);
    if (!report) {
      std::fprintf(stderr, "moonrun verify: %s\n", report.status().message().c_str());
      throw CLI::RuntimeError(2);
    }
    std::fputs(format_verify_report(*report).c_str(), stdout);
    std::fflush(stdout);
    if (!report->complete()) throw CLI::RuntimeError(1);
  });
}

}  // namespace moonrun::cli
