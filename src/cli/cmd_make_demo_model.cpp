// `moonrun make-demo-model --out DIR`: writes the random K3-shaped checkpoint (demo_model.h)
// with its tokenizer: a small BPE vocabulary trained deterministically on the built-in
// corpus with Kimi's pre-tokenisation pattern (tiktoken.model), the 256 K3 special tokens
// after it. Tests and benchmarks use it; the served demo model is models/moonrun-demo.
#include <cstdio>
#include <string>

#include "chat/bpe_train.h"
#include "chat/pretokenize.h"
#include "cli/commands.h"
#include "model/demo_model.h"

namespace moonrun::cli {

namespace {
// BPE merges to learn (the corpus may support fewer; the vocabulary follows what is learned).
constexpr size_t kDemoMerges = 768;

[[noreturn]] void fail(const std::string& message) {
  std::fprintf(stderr, "moonrun make-demo-model: %s\n", message.c_str());
  throw CLI::RuntimeError(1);
}

Status write_demo_checkpoint(const std::string& dir) {
  auto ranks = chat::train_bpe_ranks(chat::builtin_bpe_corpus(), kDemoMerges, chat::kKimiPattern);
  if (!ranks.is_ok()) return ranks.status();
  MR_RETURN_IF_ERROR(write_demo_model(dir, static_cast<int>(ranks->size())));
  return chat::write_tiktoken_model(dir + "/tiktoken.model", *ranks);
}
}  // namespace

void add_make_demo_model_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("make-demo-model",
                                 "Write a small random K3-shaped checkpoint with its tokenizer (random weights, fixed seed; for tests)");
  auto out = std::make_shared<std::string>();
  cmd->add_option("--out", *out, "output directory")->required();
  cmd->callback([out] {
    Status st = write_demo_checkpoint(*out);
    if (!st.is_ok()) fail(st.message());
  });
}

}  // namespace moonrun::cli
