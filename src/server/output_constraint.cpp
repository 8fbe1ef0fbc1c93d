#include "server/output_constraint.h"

#include <algorithm>
#include <mutex>
#include <unordered_map>

#include "chat/output_grammar.h"
#include "grammar/matcher.h"

namespace moonrun::server {
namespace {

class GrammarConstraint final : public TokenConstraint {
 public:
  GrammarConstraint(std::shared_ptr<grammar::GrammarRuntime> runtime, int64_t max_tokens)
      : matcher_(std::move(runtime), max_tokens) {}
  void fill_allowed(std::span<uint32_t> allowed_bits) override { matcher_.fill_allowed(allowed_bits); }
  bool accept(int32_t token) override { return matcher_.accept(token); }
  bool finished() const override { return matcher_.finished(); }
  std::unique_ptr<TokenConstraint> clone() const override {
    return std::unique_ptr<TokenConstraint>(new GrammarConstraint(*this));
  }

 private:
  grammar::Matcher matcher_;
};

// The tokenizer's vocabulary for the masks, built once per tokenizer.
std::shared_ptr<const grammar::TokenVocab> vocab_for(const ServingContext& ctx) {
  static std::mutex mu;
  static const chat::Tokenizer* built_for = nullptr;
  static std::shared_ptr<const grammar::TokenVocab> vocab;
  std::lock_guard<std::mutex> lock(mu);
  if (built_for != ctx.tokenizer.get() || !vocab) {
    vocab = chat::token_vocab(*ctx.tokenizer, ctx.engine ? ctx.engine->config().eos_token_ids : std::vector<int32_t>{});
    built_for = ctx.tokenizer.get();
  }
  return vocab;
}

// Compiled grammars by what they depend on. Bounded: a client sending a new schema with
// every request must not grow the server without end.
constexpr size_t kMaxCachedGrammars = 64;

}  // namespace

Result<ConstraintFactory> output_constraint(const ServingContext& ctx, const chat::ChatRequest& request,
                                            int max_tokens) {
  static std::mutex mu;
  static std::unordered_map<std::string, std::shared_ptr<grammar::GrammarRuntime>> cache;
  const std::string key = chat::output_grammar_key(ctx.chat_format, request);
  std::shared_ptr<grammar::GrammarRuntime> runtime;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (auto it = cache.find(key); it != cache.end()) runtime = it->second;
  }
  if (!runtime) {
    auto g = chat::output_grammar(ctx.chat_format, request, *ctx.tokenizer);
    if (!g.is_ok()) return g.status();
    if (!*g) return ConstraintFactory();
    runtime = std::make_shared<grammar::GrammarRuntime>(*g, vocab_for(ctx));
    std::lock_guard<std::mutex> lock(mu);
    if (cache.size() >= kMaxCachedGrammars) cache.clear();
    cache.emplace(key, runtime);
  }
  // The shortest output in symbols (bytes, special tokens) bounds its tokens from above;
  // a budget that cannot hold it even in the vocabulary's longest tokens is refused, any
  // other runs (closed early by budget forcing, or cut at max_tokens if it truly cannot fit).
  const int64_t shortest = runtime->distance(runtime->initial_state());
  const auto longest_token = static_cast<int64_t>(std::max<size_t>(1, runtime->vocab().max_token_bytes()));
  if (max_tokens >= 0 && static_cast<int64_t>(max_tokens) * longest_token < shortest)
    return invalid_argument("max_tokens: " + std::to_string(max_tokens) +
                            " is too small for the requested output format: its shortest form is " +
                            std::to_string(shortest) + " bytes, and " + std::to_string(max_tokens) +
                            " tokens hold at most " + std::to_string(max_tokens * longest_token));
  return ConstraintFactory([runtime, max_tokens] {
    return std::unique_ptr<TokenConstraint>(new GrammarConstraint(runtime, max_tokens));
  });
}

}  // namespace moonrun::server
