#pragma once
// The flags of `moonrun serve`: SGLang's names, vLLM's aliases and vLLM's positional model,
// and every other flag of the two servers' launch lines that users paste (the seeds'
// `sglang serve ...` and `vllm serve MODEL ...`): mapped where moonrun has the meaning,
// otherwise accepted and named in one startup warning as having no effect.
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "common/status.h"
#include "server/serve_options.h"

namespace moonrun::cli {

struct ServeFlags {
  server::ServeOptions options;
  // Raw values resolved after parsing (finish_serve_flags).
  std::string positional_model;
  std::vector<std::string> served_model_names;
  std::vector<std::string> api_keys;
  std::string api_key_file;
  std::string allowed_origins, allowed_methods, allowed_headers;
  bool disable_log_requests = false;
  bool enable_expert_parallel = false;
  int pipeline_parallel_size = 1;
  int data_parallel_size = 1;
  bool enable_dp_attention = false;
  // Speculative decoding, as typed: vLLM's JSON and SGLang's flags (finish_serve_flags).
  std::string speculative_config;
  std::string speculative_algorithm;
  std::string speculative_draft_model_path;
  int speculative_num_draft_tokens = -1;
  int speculative_ngram_min = -1, speculative_ngram_max = -1;
  // The no-effect flags: the CLI11 option and how it was spelled.
  std::vector<std::pair<CLI::Option*, std::string>> ignored;
  std::deque<std::string> ignored_values;  // storage for their values (stable addresses)
};

// Declares every flag on cmd (storing into *flags).
void add_serve_flags(CLI::App* cmd, const std::shared_ptr<ServeFlags>& flags);
// After parsing: resolves aliases, keys (file, environment), CORS lists, and the list of
// no-effect flags. A usage error (exit 2) as a Status.
Status finish_serve_flags(ServeFlags& flags, const std::vector<std::string>& argv);

// The speculative-decoding flags (vLLM's --speculative-config JSON, SGLang's
// --speculative-algorithm family) into one config; a usage error names the flag.
Status resolve_speculative_flags(const ServeFlags& flags, SpeculativeConfig& config);

// The warning line naming the no-effect flags ("" when none).
std::string no_effect_warning(const server::ServeOptions& opt);

// The resolved options as "key=value" pairs: one line (the startup dump) or one per line
// (--dry-run).
std::string describe_serve_options(const server::ServeOptions& opt, bool one_line);

// The repo id the guides and the seeds' requests use: the demo model, served when no model
// is given, answers to it as a checkpoint answers to its path.
inline constexpr const char* kDemoModelStandsFor = "moonshotai/Kimi-K3";

// Every name the served model answers to: the served name, the other --served-model-name
// values, the model path as given and its last component (for the demo model served by
// default, kDemoModelStandsFor and "Kimi-K3"), without repeats.
std::vector<std::string> model_names(const server::ServeOptions& opt, const std::string& served_name);

// This process's command line (/proc/self/cmdline), for the startup dump.
std::vector<std::string> process_arguments();

}  // namespace moonrun::cli
