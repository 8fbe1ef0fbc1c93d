#pragma once
// A per-sequence restriction on which token may come next: structured output (a JSON
// schema, a forced tool call) compiled by the server into a token automaton. The engine and
// the runner know only this interface; what the automaton is (grammar, tool-call markup,
// the chat format) stays above them, so the dependencies point down.
//
// Per sampling step the engine asks fill_allowed() for a bitmask over the vocabulary and
// puts it in the sequence's sampling row (backend/sampling.h: tokens outside it become -inf
// on the device where the model runs), and reports the sampled token with accept().
#include <cstdint>
#include <memory>
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
  // A copy at the same position. Speculative decoding masks each draft's row with a copy
  // advanced over the drafts before it (and cuts drafts the automaton refuses), while this
  // one advances only over the tokens kept. None: the sequence gets no drafts.
  virtual std::unique_ptr<TokenConstraint> clone() const { return nullptr; }
};

}  // namespace moonrun
