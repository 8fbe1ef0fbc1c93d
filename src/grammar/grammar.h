#pragma once
// A context-free grammar over the symbols a tokenizer produces: the 256 byte values plus
// the special tokens the grammar names (<|open|>, <|end_of_msg|>, ...), each one symbol.
//
// The representation is a recursive transition network: every rule is a small NFA whose
// edges either consume one symbol from a set or call another rule (with the node to go
// on at when the callee ends). That is what JSON Schema needs: recursion ($ref, nested
// values) and alternatives that share prefixes (anyOf, enums), without an LR table. The
// Builder assembles rules from fragments (literal, symbol set, sequence, alternative,
// repetition) with epsilon edges, and finish() removes the epsilons and computes, for
// every node, the fewest symbols that complete its rule (what budget forcing needs).
#include <bitset>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace moonrun::grammar {

// Symbols 0..255 are bytes; kFirstSpecial + k is the grammar's k-th special token.
using Symbol = uint16_t;
constexpr int kFirstSpecial = 256;
constexpr int kMaxSpecials = 64;
using SymbolSet = std::bitset<kFirstSpecial + kMaxSpecials>;

struct Edge {
  enum class Kind : uint8_t { kSymbols, kCall };
  Kind kind = Kind::kSymbols;
  int32_t target = -1;  // the node to continue at (after the symbol, or after the callee)
  int32_t set = -1;     // kSymbols: index into Grammar::sets
  int32_t rule = -1;    // kCall: the rule to run first
};

struct Node {
  std::vector<Edge> edges;
  bool final = false;       // the rule may end here
  int32_t rule = -1;        // the rule this node belongs to
  int32_t min_to_end = 0;   // fewest symbols from here to the end of the rule
};

struct Rule {
  std::string name;
  int32_t start = -1;
  int32_t min_length = 0;  // fewest symbols the rule matches
};

struct Grammar {
  std::vector<Node> nodes;
  std::vector<Rule> rules;
  std::vector<SymbolSet> sets;
  std::vector<int32_t> special_tokens;  // k -> token id of symbol kFirstSpecial + k
  int32_t root = -1;                    // the rule the whole text must match

  Symbol special_symbol(int32_t token_id) const;  // MR_CHECKs that the grammar names it
};

// Builds a Grammar. Fragments belong to the rule under construction; each is used once
// (repeat() takes a generator for that reason).
class Builder {
 public:
  struct Frag {
    int32_t start = -1;
    int32_t end = -1;
  };

  int32_t declare_rule(std::string name);  // defined later by define(); may be called before
  void define(int32_t rule, const std::function<Frag()>& body);

  // Within define()'s body:
  Frag empty();
  Frag symbols(const SymbolSet& set);
  Frag byte_range(uint8_t lo, uint8_t hi);
  Frag literal(std::string_view bytes);  // each byte one symbol
  Frag special(int32_t token_id);        // one special-token symbol
  Frag call(int32_t rule);
  Frag seq(std::vector<Frag> parts);
  Frag alt(std::vector<Frag> options);
  Frag opt(Frag f);
  Frag star(Frag f);
  Frag plus(const std::function<Frag()>& make);
  // make() repeated min..max times; max < 0: unbounded.
  Frag repeat(const std::function<Frag()>& make, int min, int max);

  // Low level, for automata that fragments do not express (the comma lanes of an object):
  // a fresh node of the rule being defined, and an epsilon edge.
  int32_t make_node() { return node(); }
  void connect(int32_t from, int32_t to) { eps(from, to); }

  // Removes the epsilon edges and computes the distances. The builder is spent after.
  Grammar finish(int32_t root_rule);

  // The number of nodes so far (schemas are refused before they grow unreasonably).
  size_t size() const { return nodes_.size(); }

 private:
  struct BNode {
    std::vector<Edge> edges;
    std::vector<int32_t> eps;
    int32_t rule = -1;
  };
  int32_t node();
  void eps(int32_t from, int32_t to) { nodes_[from].eps.push_back(to); }
  int32_t set_index(const SymbolSet& set);

  std::vector<BNode> nodes_;
  std::vector<Rule> rules_;
  std::vector<int32_t> rule_end_;  // the end node of each defined rule
  std::vector<SymbolSet> sets_;
  std::vector<int32_t> specials_;
  int32_t current_rule_ = -1;
};

}  // namespace moonrun::grammar
