// Grammar construction: Thompson-style fragments with epsilon edges, then epsilon removal
// and the per-node distances to the end of each rule.
#include "grammar/grammar.h"

#include <algorithm>
#include <climits>
#include <unordered_map>

#include "common/check.h"

namespace moonrun::grammar {

Symbol Grammar::special_symbol(int32_t token_id) const {
  for (size_t k = 0; k < special_tokens.size(); ++k)
    if (special_tokens[k] == token_id) return static_cast<Symbol>(kFirstSpecial + k);
  MR_CHECK(false) << "grammar does not name special token " << token_id;
  return 0;
}

int32_t Builder::node() {
  nodes_.push_back(BNode{{}, {}, current_rule_});
  return static_cast<int32_t>(nodes_.size()) - 1;
}

int32_t Builder::set_index(const SymbolSet& set) {
  for (size_t i = 0; i < sets_.size(); ++i)
    if (sets_[i] == set) return static_cast<int32_t>(i);
  sets_.push_back(set);
  return static_cast<int32_t>(sets_.size()) - 1;
}

int32_t Builder::declare_rule(std::string name) {
  rules_.push_back(Rule{std::move(name), -1, 0});
  rule_end_.push_back(-1);
  return static_cast<int32_t>(rules_.size()) - 1;
}

void Builder::define(int32_t rule, const std::function<Frag()>& body) {
  MR_CHECK(rule >= 0 && rule < static_cast<int32_t>(rules_.size()) && rules_[rule].start < 0)
      << "rule " << rule << " defined twice or not declared";
  const int32_t saved = current_rule_;
  current_rule_ = rule;
  const Frag f = body();
  rules_[rule].start = f.start;
  rule_end_[rule] = f.end;
  current_rule_ = saved;
}

// Fragments keep one rule: nothing leads from a fragment's end back into the fragment, so
// sequencing, skipping (opt) and repeating compose without surprises.
Builder::Frag Builder::empty() {
  const int32_t n = node();
  return {n, n};
}

Builder::Frag Builder::symbols(const SymbolSet& set) {
  const int32_t a = node(), b = node();
  nodes_[a].edges.push_back(Edge{Edge::Kind::kSymbols, b, set_index(set), -1});
  return {a, b};
}

Builder::Frag Builder::byte_range(uint8_t lo, uint8_t hi) {
  SymbolSet s;
  for (int c = lo; c <= hi; ++c) s.set(c);
  return symbols(s);
}

Builder::Frag Builder::literal(std::string_view bytes) {
  const int32_t start = node();
  int32_t at = start;
  for (unsigned char c : bytes) {
    SymbolSet s;
    s.set(c);
    const int32_t next = node();
    nodes_[at].edges.push_back(Edge{Edge::Kind::kSymbols, next, set_index(s), -1});
    at = next;
  }
  return {start, at};
}

Builder::Frag Builder::special(int32_t token_id) {
  size_t k = 0;
  while (k < specials_.size() && specials_[k] != token_id) ++k;
  if (k == specials_.size()) {
    MR_CHECK(specials_.size() < static_cast<size_t>(kMaxSpecials)) << "a grammar names at most " << kMaxSpecials << " special tokens";
    specials_.push_back(token_id);
  }
  SymbolSet s;
  s.set(kFirstSpecial + k);
  return symbols(s);
}

Builder::Frag Builder::call(int32_t rule) {
  const int32_t a = node(), b = node();
  nodes_[a].edges.push_back(Edge{Edge::Kind::kCall, b, -1, rule});
  return {a, b};
}

Builder::Frag Builder::seq(std::vector<Frag> parts) {
  if (parts.empty()) return empty();
  for (size_t i = 0; i + 1 < parts.size(); ++i) eps(parts[i].end, parts[i + 1].start);
  return {parts.front().start, parts.back().end};
}

Builder::Frag Builder::alt(std::vector<Frag> options) {
  const int32_t a = node(), b = node();
  for (const Frag& f : options) {
    eps(a, f.start);
    eps(f.end, b);
  }
  return {a, b};
}

Builder::Frag Builder::opt(Frag f) {
  eps(f.start, f.end);
  return f;
}

Builder::Frag Builder::star(Frag f) {
  // The exit is a node of its own: a fragment's end must not lead back into it, or a
  // construct that skips to the end (opt) would land inside the loop.
  const int32_t a = node(), b = node();
  eps(a, f.start);
  eps(f.end, a);
  eps(a, b);
  return {a, b};
}

Builder::Frag Builder::plus(const std::function<Frag()>& make) {
  Frag first = make();
  return seq({first, star(make())});
}

Builder::Frag Builder::repeat(const std::function<Frag()>& make, int min, int max) {
  std::vector<Frag> parts;
  for (int i = 0; i < min; ++i) parts.push_back(make());
  if (max < 0) {
    parts.push_back(star(make()));
  } else {
    // Optional copies nested so that a skipped one ends the run: (x (x (x)?)?)?
    Frag tail = empty();
    for (int i = min; i < max; ++i) {
      Frag x = make();
      eps(x.end, tail.start);
      Frag one{x.start, tail.end};
      tail = opt(one);
    }
    parts.push_back(tail);
  }
  return seq(std::move(parts));
}

Grammar Builder::finish(int32_t root_rule) {
  for (size_t r = 0; r < rules_.size(); ++r)
    MR_CHECK(rules_[r].start >= 0) << "rule " << rules_[r].name << " declared but never defined";
  Grammar g;
  const auto n_nodes = static_cast<int32_t>(nodes_.size());
  g.nodes.resize(n_nodes);
  // Epsilon closure of every node: its edges are the union of the closure's, and it is
  // final when the closure holds its rule's end.
  std::vector<int32_t> seen(n_nodes, -1), stack;
  for (int32_t n = 0; n < n_nodes; ++n) {
    Node& out = g.nodes[n];
    out.rule = nodes_[n].rule;
    stack.assign(1, n);
    seen[n] = n;
    while (!stack.empty()) {
      const int32_t c = stack.back();
      stack.pop_back();
      if (out.rule >= 0 && c == rule_end_[out.rule]) out.final = true;
      for (const Edge& e : nodes_[c].edges) {
        const bool dup = std::any_of(out.edges.begin(), out.edges.end(), [&](const Edge& x) {
          return x.kind == e.kind && x.target == e.target && x.set == e.set && x.rule == e.rule;
        });
        if (!dup) out.edges.push_back(e);
      }
      for (int32_t next : nodes_[c].eps) {
        if (seen[next] == n) continue;
        seen[next] = n;
        stack.push_back(next);
      }
    }
  }
  // Fewest symbols to the end of the rule, by relaxation until nothing changes (calls cost
  // their callee's minimum, which is the same quantity at the callee's start).
  constexpr int32_t kInf = INT32_MAX / 4;
  for (auto& nd : g.nodes) nd.min_to_end = nd.final ? 0 : kInf;
  for (bool changed = true; changed;) {
    changed = false;
    for (auto& nd : g.nodes) {
      for (const Edge& e : nd.edges) {
        int32_t via = g.nodes[e.target].min_to_end;
        via = e.kind == Edge::Kind::kSymbols ? via + 1 : via + g.nodes[rules_[e.rule].start].min_to_end;
        via = std::min(via, kInf);
        if (via < nd.min_to_end) {
          nd.min_to_end = via;
          changed = true;
        }
      }
    }
  }
  for (auto& r : rules_) r.min_length = g.nodes[r.start].min_to_end;
  g.rules = std::move(rules_);
  g.sets = std::move(sets_);
  g.special_tokens = std::move(specials_);
  g.root = root_rule;
  nodes_.clear();
  return g;
}

}  // namespace moonrun::grammar
