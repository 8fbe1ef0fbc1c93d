#pragma once
// Running a Grammar over tokens: which tokens may come next (a bitmask over the
// vocabulary) and the state after each sampled token.
//
// A parse state is the set of threads (node, call stack) that can consume the next symbol,
// with the call stacks interned (a stack is an id: parent id + return node), so a state is
// a short sorted vector of int pairs, itself interned to one id. Everything expensive is
// cached per state id and shared by every sequence running the grammar:
//   transitions  state x symbol -> state, filled as the trie walks need them;
//   token masks  the tokens allowed from a state, computed once by walking the vocabulary
//                trie from it (pruned at the first byte the grammar rejects), then a copy;
//   distances    the fewest symbols from a state to the end of the grammar.
// A sampling step is then one hash lookup and a 4-bytes-per-32-tokens copy.
//
// Budget forcing: a sequence knows how many tokens it may still generate. A token whose
// state needs more symbols to finish than tokens are left is not allowed, so the text is
// always complete (valid JSON, a closed tool call) when max_tokens runs out, even for a
// model that never would end on its own (the random demo model). Every byte and special
// token is one token of a byte-level BPE vocabulary, so a symbol count bounds the tokens.
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <unordered_map>
#include <vector>

#include "grammar/grammar.h"
#include "grammar/vocab.h"

namespace moonrun::grammar {

// The shared, growing caches of one grammar on one vocabulary. Thread-safe.
class GrammarRuntime {
 public:
  GrammarRuntime(std::shared_ptr<const Grammar> grammar, std::shared_ptr<const TokenVocab> vocab);

  int32_t initial_state();
  // The state after symbol; kDead if the grammar rejects it.
  int32_t advance(int32_t state, Symbol symbol);
  // The state after a token's symbols (its bytes, or its special symbol).
  int32_t advance_token(int32_t state, int32_t token);
  bool accepting(int32_t state);
  bool at_end(int32_t state);  // accepting, and no symbol may follow
  bool is_dead(int32_t state) const { return state == kDead; }
  // Fewest tokens to the end of the generation: the symbols left, plus the EOS token when
  // the grammar does not spell its own end with one.
  int32_t distance(int32_t state);
  // The allowed tokens from state, given that at most tokens_left tokens (this one
  // included) may still be generated; tokens_left < 0: no limit. EOS is allowed when the
  // state accepts.
  void fill_mask(int32_t state, int64_t tokens_left, std::span<uint32_t> words);

  const Grammar& grammar() const { return *grammar_; }
  const TokenVocab& vocab() const { return *vocab_; }

  static constexpr int32_t kDead = -1;
  static constexpr int32_t kNoLimit = INT32_MAX / 4;

 private:
  struct Thread {
    int32_t node;
    int32_t stack;
    bool operator==(const Thread& o) const { return node == o.node && stack == o.stack; }
    bool operator<(const Thread& o) const { return node != o.node ? node < o.node : stack < o.stack; }
  };
  struct State {
    std::vector<Thread> threads;  // sorted, unique; each at a node with symbol edges
    bool accepting = false;
    int32_t distance = -1;               // computed lazily
    std::vector<int32_t> byte_next;      // 256 entries once used: -2 unknown, else a state
    std::vector<uint32_t> mask;          // the unconstrained-budget mask, once computed
    int32_t max_next_distance = 0;       // the largest distance among the mask's successors
  };

  int32_t push_stack(int32_t parent, int32_t return_node);
  int32_t stack_cost(int32_t stack);
  void expand(int32_t node, int32_t stack, std::vector<Thread>& out, bool& accepting, int depth);
  int32_t intern(std::vector<Thread> threads, bool accepting);
  int32_t advance_locked(int32_t state, Symbol symbol);
  int32_t distance_locked(int32_t state);
  // Walks the trie from state; allowed tokens go to words. With a budget, only tokens whose
  // successor state's distance fits. Returns the largest successor distance seen.
  int32_t walk(int32_t state, int64_t budget, std::span<uint32_t> words);

  std::shared_ptr<const Grammar> grammar_;
  std::shared_ptr<const TokenVocab> vocab_;
  std::vector<int32_t> special_symbol_of_token_;  // token id -> symbol, or -1

  std::mutex mu_;
  std::vector<std::pair<int32_t, int32_t>> stacks_;  // id -> (parent, return node); 0 = empty
  std::unordered_map<uint64_t, int32_t> stack_ids_;
  std::vector<int32_t> stack_costs_;
  std::vector<State> states_;
  std::unordered_map<uint64_t, std::vector<int32_t>> state_ids_;  // hash -> candidate ids
  std::unordered_map<uint64_t, int32_t> special_next_;           // state << 16 | symbol -> state
  int32_t initial_ = -2;
  int32_t end_cost_ = 1;  // tokens it takes to end once the grammar accepts
};

// One sequence's position in a grammar, with its token budget.
class Matcher {
 public:
  // max_tokens < 0: no limit.
  Matcher(std::shared_ptr<GrammarRuntime> runtime, int64_t max_tokens);

  void fill_allowed(std::span<uint32_t> words);
  bool accept(int32_t token);
  bool finished() const;  // nothing but the end can follow (or the grammar was left)
  int32_t distance() const { return runtime_->distance(state_); }

 private:
  std::shared_ptr<GrammarRuntime> runtime_;
  int32_t state_;
  int64_t tokens_left_;
  bool ended_ = false;  // an EOS token was accepted
};

}  // namespace moonrun::grammar
