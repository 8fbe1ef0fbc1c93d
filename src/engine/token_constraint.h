#pragma once
// A per-sequence restriction on which token may come next: structured output (a JSON
// schema, a forced tool call) compiled by the server into a token automaton. The engine
// knows only this interface; what the automaton is (grammar, tool-call markup, the chat
// format) stays above it, so the dependencies point down (server -> engine).
//
// Per sampling step the engine asks fill_allowed() for a bitmask over the vocabulary, sets
// the logits of the tokens outside it to -inf, samples, and reports the sampled token with
// accept(). Written for the CPU sampler today; the bitmask is the shape a GPU sampler
// takes as well (one 32-bit word per 32 tokens, uploaded per step).
#include <cstdint>
#include <span>

namespace moonrun {

class TokenConstraint {
 public:
  virtual ~TokenConstraint() = default;
  // bit t set (word t/32, bit t%32) = token t allowed next; called once per sampling step.
  // allowed_bits is zeroed by the caller and holds ceil(vocab / 32) words.
  virtual void fill_allowed(std::span<uint32_t> allowed_bits) = 0;
  // Advances over the sampled token; false if it was not allowed.
  virtual bool accept(int32_t token) = 0;
  // The automaton has reached its end: nothing more may follow.
  virtual bool finished() const = 0;
};

}  // namespace moonrun
