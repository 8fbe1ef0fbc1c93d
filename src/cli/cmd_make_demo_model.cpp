// `moonrun make-demo-model --out DIR`: writes the embedded demo model (demo_model.h) with
// its tokenizer: a small BPE vocabulary trained deterministically on the built-in corpus
// with Kimi's pre-tokenisation pattern (tiktoken.model), the 256 K3 special tokens after
// it. CMake runs this at build time into build/demo-model, so no weights live in git.
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
}  // namespace

Status write_demo_checkpoint(const std::string& dir) {
  auto ranks = chat::train_bpe_ranks(chat::builtin_bpe_corpus(), kDemoMerges, chat::kKimiPattern);
  if (!ranks.is_ok()) return ranks.status();
  MR_RETURN_IF_ERROR(write_demo_model(dir, static_cast<int>(ranks->size())));
  return chat::write_tiktoken_model(dir + "/tiktoken.model", *ranks);
}

void add_make_demo_model_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("make-demo-model",
                                 "Write the small K3-shaped demo checkpoint (random weights, fixed seed)");
  auto out = std::make_shared<std::string>();
  cmd->add_option("--out", *out, "output directory")->required();
  cmd->callback([out] {
    Status st = write_demo_checkpoint(*out);
    if (!st.is_ok()) fail(st.message());
  });
}

}  // namespace moonrun::cli
