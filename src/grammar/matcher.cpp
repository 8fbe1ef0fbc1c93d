// Grammar states, their transitions, token masks and distances; see matcher.h.
#include "grammar/matcher.h"

#include <algorithm>

#include "common/check.h"

namespace moonrun::grammar {
namespace {

// Calls nest this deep at most: a guard against a left-recursive rule (none is ever
// built) rather than a limit anyone meets (JSON nesting is far shallower).
constexpr int kMaxCallDepth = 4000;

uint64_t mix(uint64_t h, uint64_t v) {
  h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
  return h;
}

void set_bit(std::span<uint32_t> words, int32_t token) {
  if (token >= 0 && static_cast<size_t>(token) / 32 < words.size()) words[token / 32] |= 1u << (token % 32);
}

}  // namespace

GrammarRuntime::GrammarRuntime(std::shared_ptr<const Grammar> grammar, std::shared_ptr<const TokenVocab> vocab)
    : grammar_(std::move(grammar)), vocab_(std::move(vocab)) {
  special_symbol_of_token_.assign(vocab_->size(), -1);
  for (size_t k = 0; k < grammar_->special_tokens.size(); ++k) {
    const int32_t id = grammar_->special_tokens[k];
    MR_CHECK(id >= 0 && id < vocab_->size() && vocab_->is_special(id))
        << "grammar names token " << id << " as special; the vocabulary does not";
    special_symbol_of_token_[id] = kFirstSpecial + static_cast<int32_t>(k);
  }
  stacks_.push_back({-1, -1});  // id 0: the empty stack
  stack_costs_.push_back(0);
  // Ending takes one more token, EOS, unless the grammar spells its own end with an EOS
  // token (K3 completions end in <|end_of_msg|>).
  end_cost_ = 1;
  for (int32_t id : grammar_->special_tokens)
    if (std::find(vocab_->eos().begin(), vocab_->eos().end(), id) != vocab_->eos().end()) end_cost_ = 0;
}

int32_t GrammarRuntime::push_stack(int32_t parent, int32_t return_node) {
  const uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(parent)) << 32) | static_cast<uint32_t>(return_node);
  auto it = stack_ids_.find(key);
  if (it != stack_ids_.end()) return it->second;
  const auto id = static_cast<int32_t>(stacks_.size());
  stacks_.push_back({parent, return_node});
  stack_costs_.push_back(-1);
  stack_ids_.emplace(key, id);
  return id;
}

int32_t GrammarRuntime::stack_cost(int32_t stack) {
  if (stack_costs_[stack] >= 0) return stack_costs_[stack];
  const auto [parent, ret] = stacks_[stack];
  const int32_t cost = std::min(grammar_->nodes[ret].min_to_end + stack_cost(parent), kNoLimit);
  stack_costs_[stack] = cost;
  return cost;
}

void GrammarRuntime::expand(int32_t node, int32_t stack, std::vector<Thread>& out, bool& accepting, int depth) {
  if (depth > kMaxCallDepth) return;
  const Node& nd = grammar_->nodes[node];
  bool consumes = false;
  for (const Edge& e : nd.edges) {
    if (e.kind == Edge::Kind::kSymbols) {
      consumes = true;
    } else {
      expand(grammar_->rules[e.rule].start, push_stack(stack, e.target), out, accepting, depth + 1);
    }
  }
  if (consumes) out.push_back({node, stack});
  if (nd.final) {
    if (stack == 0) {
      accepting = true;
    } else {
      const auto [parent, ret] = stacks_[stack];
      expand(ret, parent, out, accepting, depth + 1);
    }
  }
}

int32_t GrammarRuntime::intern(std::vector<Thread> threads, bool accepting) {
  std::sort(threads.begin(), threads.end());
  threads.erase(std::unique(threads.begin(), threads.end()), threads.end());
  if (threads.empty() && !accepting) return kDead;
  uint64_t h = accepting ? 1 : 2;
  for (const Thread& t : threads) h = mix(mix(h, static_cast<uint64_t>(t.node)), static_cast<uint64_t>(t.stack));
  auto& candidates = state_ids_[h];
  for (int32_t id : candidates)
    if (states_[id].accepting == accepting && states_[id].threads == threads) return id;
  const auto id = static_cast<int32_t>(states_.size());
  State s;
  s.threads = std::move(threads);
  s.accepting = accepting;
  states_.push_back(std::move(s));
  candidates.push_back(id);
  return id;
}

int32_t GrammarRuntime::initial_state() {
  std::lock_guard<std::mutex> lock(mu_);
  if (initial_ == -2) {
    std::vector<Thread> threads;
    bool accepting = false;
    expand(grammar_->rules[grammar_->root].start, 0, threads, accepting, 0);
    initial_ = intern(std::move(threads), accepting);
  }
  return initial_;
}

int32_t GrammarRuntime::advance_locked(int32_t state, Symbol symbol) {
  if (state == kDead) return kDead;
  if (symbol < kFirstSpecial) {
    auto& next = states_[state].byte_next;
    if (next.empty()) next.assign(256, -2);
    if (next[symbol] != -2) return next[symbol];
  } else {
    auto it = special_next_.find((static_cast<uint64_t>(state) << 16) | symbol);
    if (it != special_next_.end()) return it->second;
  }
  std::vector<Thread> threads;
  bool accepting = false;
  const std::vector<Thread> from = states_[state].threads;  // states_ may grow below
  for (const Thread& t : from) {
    for (const Edge& e : grammar_->nodes[t.node].edges)
      if (e.kind == Edge::Kind::kSymbols && grammar_->sets[e.set][symbol]) expand(e.target, t.stack, threads, accepting, 0);
  }
  const int32_t result = intern(std::move(threads), accepting);
  if (symbol < kFirstSpecial) {
    states_[state].byte_next[symbol] = result;
  } else {
    special_next_[(static_cast<uint64_t>(state) << 16) | symbol] = result;
  }
  return result;
}

int32_t GrammarRuntime::advance(int32_t state, Symbol symbol) {
  std::lock_guard<std::mutex> lock(mu_);
  return advance_locked(state, symbol);
}

int32_t GrammarRuntime::advance_token(int32_t state, int32_t token) {
  if (token < 0 || token >= vocab_->size()) return kDead;
  std::lock_guard<std::mutex> lock(mu_);
  if (vocab_->is_special(token)) {
    const int32_t symbol = special_symbol_of_token_[token];
    return symbol < 0 ? kDead : advance_locked(state, static_cast<Symbol>(symbol));
  }
  for (unsigned char c : vocab_->bytes(token)) state = advance_locked(state, c);
  return vocab_->bytes(token).empty() ? kDead : state;
}

bool GrammarRuntime::accepting(int32_t state) {
  if (state == kDead) return false;
  std::lock_guard<std::mutex> lock(mu_);
  return states_[state].accepting;
}

bool GrammarRuntime::at_end(int32_t state) {
  if (state == kDead) return false;
  std::lock_guard<std::mutex> lock(mu_);
  return states_[state].accepting && states_[state].threads.empty();
}

int32_t GrammarRuntime::distance_locked(int32_t state) {
  if (state == kDead) return kNoLimit;
  State& s = states_[state];
  if (s.distance >= 0) return s.distance;
  int32_t d = s.accepting ? 0 : kNoLimit;
  for (const Thread& t : s.threads) d = std::min(d, grammar_->nodes[t.node].min_to_end + stack_cost(t.stack));
  if (d < kNoLimit) d += end_cost_;
  states_[state].distance = d;
  return d;
}

int32_t GrammarRuntime::distance(int32_t state) {
  std::lock_guard<std::mutex> lock(mu_);
  return distance_locked(state);
}

int32_t GrammarRuntime::walk(int32_t state, int64_t budget, std::span<uint32_t> words) {
  int32_t max_distance = 0;
  auto consider = [&](int32_t token, int32_t next) {
    const int32_t d = distance_locked(next);
    if (d > budget) return;
    set_bit(words, token);
    max_distance = std::max(max_distance, d);
  };
  const auto& trie = vocab_->trie();
  struct Frame {
    uint32_t node;
    int32_t state;
  };
  std::vector<Frame> stack{{0, state}};
  while (!stack.empty()) {
    const Frame f = stack.back();
    stack.pop_back();
    const auto& tn = trie[f.node];
    for (uint32_t c = tn.first_child; c < tn.first_child + tn.n_children; ++c) {
      const int32_t next = advance_locked(f.state, trie[c].byte);
      if (next == kDead) continue;
      if (trie[c].token >= 0) consider(trie[c].token, next);
      if (trie[c].n_children) stack.push_back({c, next});
    }
  }
  for (size_t k = 0; k < grammar_->special_tokens.size(); ++k) {
    const int32_t next = advance_locked(state, static_cast<Symbol>(kFirstSpecial + k));
    if (next != kDead) consider(grammar_->special_tokens[k], next);
  }
  if (states_[state].accepting)
    for (int32_t id : vocab_->eos()) set_bit(words, id);
  return max_distance;
}

void GrammarRuntime::fill_mask(int32_t state, int64_t tokens_left, std::span<uint32_t> words) {
  if (state == kDead) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (states_[state].mask.size() != words.size()) {
    std::vector<uint32_t> mask(words.size(), 0u);
    const int32_t max_d = walk(state, kNoLimit - 1, mask);
    states_[state].mask = std::move(mask);
    states_[state].max_next_distance = max_d;
  }
  const State& s = states_[state];
  // This token leaves tokens_left - 1 for the rest: the cached mask is right when every
  // token in it leaves a state that fits; otherwise walk again keeping only those that do.
  if (tokens_left < 0 || tokens_left - 1 >= s.max_next_distance) {
    std::copy(s.mask.begin(), s.mask.end(), words.begin());
    return;
  }
  const std::vector<uint32_t> full = s.mask;
  walk(state, tokens_left - 1, words);
  const bool any = std::any_of(words.begin(), words.end(), [](uint32_t w) { return w != 0; });
  if (!any) std::copy(full.begin(), full.end(), words.begin());  // cannot finish in time: best effort
}

Matcher::Matcher(std::shared_ptr<GrammarRuntime> runtime, int64_t max_tokens)
    : runtime_(std::move(runtime)), state_(runtime_->initial_state()), tokens_left_(max_tokens) {}

void Matcher::fill_allowed(std::span<uint32_t> words) {
  if (ended_) return;
  runtime_->fill_mask(state_, tokens_left_, words);
}

bool Matcher::accept(int32_t token) {
  if (ended_) return false;
  if (tokens_left_ > 0) --tokens_left_;
  const int32_t next = runtime_->advance_token(state_, token);
  if (!runtime_->is_dead(next)) {
    state_ = next;
    return true;
  }
  const auto& eos = runtime_->vocab().eos();
  if (runtime_->accepting(state_) && std::find(eos.begin(), eos.end(), token) != eos.end()) {
    ended_ = true;
    return true;
  }
  return false;
}

bool Matcher::finished() const { return ended_ || runtime_->is_dead(state_) || runtime_->at_end(state_); }

}  // namespace moonrun::grammar
