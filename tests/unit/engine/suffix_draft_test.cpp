// Suffix decoding's drafts (engine/suffix_draft_source.h) against the algorithm as Arctic
// Inference states it (csrc/suffix_decoding/suffix_tree.cc, cache.py; used by vLLM's
// `suffix` method): a depth-limited suffix tree per request over prompt + output, one over
// the answers of earlier and current requests (FIFO, max_cached_requests), and for each
// match length the greedy path by child counts. The reference below builds that tree
// naively, one node per token (every suffix of every sequence, truncated at the depth), and
// follows it as speculate() / _speculate_path() do; ties between children with equal counts
// (Arctic: hash-map order) go to the most recent occurrence on both sides.
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <set>

#include "engine/suffix_draft_source.h"

namespace moonrun {
namespace {

struct NodeStats {
  int count = 0;
  std::pair<int, int> latest{-1, -1};  // (sequence, start) of the most recent suffix through it
};

// Every suffix of every sequence, truncated at `depth` tokens: path -> (count, latest).
struct NaiveTree {
  std::map<std::vector<int32_t>, NodeStats> nodes;
  std::set<int32_t> alphabet;
  NaiveTree(const std::vector<std::vector<int32_t>>& seqs, int depth) {
    for (int s = 0; s < static_cast<int>(seqs.size()); ++s)
      for (int p = 0; p < static_cast<int>(seqs[s].size()); ++p) {
        std::vector<int32_t> path;
        for (int d = 0; d < depth && p + d < static_cast<int>(seqs[s].size()); ++d) {
          path.push_back(seqs[s][p + d]);
          alphabet.insert(seqs[s][p + d]);
          NodeStats& n = nodes[path];
          ++n.count;
          n.latest = std::max(n.latest, std::make_pair(s, p));
        }
      }
  }
  struct Draft {
    std::vector<int32_t> tokens;
    double score = 0;
  };
  Draft speculate(const std::vector<int32_t>& context, int max_spec, int depth, double factor, double min_prob) const {
    Draft best;
    const int L = static_cast<int>(context.size());
    for (int m = 1; m < std::min(L, depth); ++m) {  // Arctic: context = the last `depth` tokens
      std::vector<int32_t> path(context.end() - m, context.end());
      auto it = nodes.find(path);
      if (it == nodes.end()) break;
      const int limit = std::min({max_spec, static_cast<int>(m * factor + 1e-6), depth - m});
      Draft d;
      double prob = 1;
      int count = it->second.count;
      while (static_cast<int>(d.tokens.size()) < limit) {
        const NodeStats* child = nullptr;
        int32_t token = 0;
        path.push_back(0);
        for (int32_t t : alphabet) {
          path.back() = t;
          auto c = nodes.find(path);
          if (c == nodes.end()) continue;
          if (!child || c->second.count > child->count ||
              (c->second.count == child->count && c->second.latest > child->latest)) {
            child = &c->second;
            token = t;
          }
        }
        if (!child) break;
        path.back() = token;
        prob *= static_cast<double>(child->count) / count;
        if (prob < min_prob) break;
        count = child->count;
        d.tokens.push_back(token);
        d.score += prob;
      }
      if (limit > 0 && d.score >= best.score) best = d;
    }
    return best;
  }
};

std::vector<int32_t> random_text(std::mt19937& rng, int n, int vocab, const std::vector<int32_t>& motif) {
  std::vector<int32_t> out;
  while (static_cast<int>(out.size()) < n) {
    if (rng() % 3 == 0) {
      out.insert(out.end(), motif.begin(), motif.end());  // something to match, long
    } else {
      out.push_back(static_cast<int32_t>(rng() % vocab));
    }
  }
  out.resize(n);
  return out;
}

TEST(SuffixDrafts, MatchTheSuffixTreeAlgorithmOnRandomHistories) {
  std::mt19937 rng(7);
  int compared = 0, nonempty = 0, from_answers = 0;
  for (int trial = 0; trial < 300; ++trial) {
    SpeculativeConfig c;
    c.method = SpecMethod::kSuffix;
    c.suffix_max_tree_depth = trial % 3 == 0 ? 8 : 24;
    c.suffix_max_cached_requests = std::vector<int>{0, 2, 10000}[trial % 5 % 3];
    c.suffix_max_spec_factor = trial % 4 == 0 ? 2.0 : 1.0;
    c.suffix_min_token_prob = trial % 2 ? 0.1 : 0.3;
    const int vocab = 4 + trial % 5, max_tokens = trial % 2 ? 16 : 4;
    std::vector<int32_t> motif;
    for (int i = 0; i < 5 + trial % 7; ++i) motif.push_back(static_cast<int32_t>(rng() % vocab));
    SuffixDraftSource src(c);
    // Earlier requests, finished one after another: their answers are the shared history.
    std::vector<std::vector<int32_t>> answers;
    const int n_earlier = 1 + trial % 4;
    for (int r = 0; r < n_earlier; ++r) {
      const std::vector<int32_t> prompt = random_text(rng, 20, vocab, motif);
      answers.push_back(random_text(rng, 10 + static_cast<int>(rng() % 40), vocab, motif));
      src.release({100 + r, prompt, answers.back()});
    }
    // The current request, drafted for at every step of its output.
    const std::vector<int32_t> prompt = random_text(rng, 30 + static_cast<int>(rng() % 60), vocab, motif);
    const std::vector<int32_t> output = random_text(rng, 40, vocab, motif);
    for (int n_out = 0; n_out <= static_cast<int>(output.size()); n_out += 3) {
      const std::span<const int32_t> out(output.data(), n_out);
      std::vector<int32_t> drafts;
      src.propose({1, prompt, out}, max_tokens, drafts);

      std::vector<int32_t> own(prompt);
      own.insert(own.end(), out.begin(), out.end());
      const int depth = c.suffix_max_tree_depth;
      const std::vector<int32_t> context(own.end() - std::min<int>(depth, static_cast<int>(own.size())), own.end());
      NaiveTree::Draft expected = NaiveTree({own}, depth).speculate(context, max_tokens, depth, c.suffix_max_spec_factor,
                                                                    c.suffix_min_token_prob);
      if (c.suffix_max_cached_requests > 0) {
        // FIFO: the newest max_cached_requests answers, the current request's among them.
        std::vector<std::vector<int32_t>> kept(answers);
        kept.push_back(std::vector<int32_t>(out.begin(), out.end()));
        if (static_cast<int>(kept.size()) > c.suffix_max_cached_requests)
          kept.erase(kept.begin(), kept.end() - c.suffix_max_cached_requests);
        const NaiveTree::Draft other = NaiveTree(kept, depth).speculate(context, max_tokens, depth,
                                                                        c.suffix_max_spec_factor, c.suffix_min_token_prob);
        if (other.score > expected.score) {
          expected = other;
          ++from_answers;
        }
      }
      ASSERT_EQ(drafts, expected.tokens) << "trial " << trial << ", output " << n_out;
      ++compared;
      nonempty += drafts.empty() ? 0 : 1;
    }
  }
  std::printf("compared %d drafts, %d not empty, %d from earlier answers\n", compared, nonempty, from_answers);
  EXPECT_GT(nonempty, compared / 2);
  EXPECT_GT(from_answers, 50);
}

// What suffix decoding is for: an agent's loop repeats an earlier answer, which is drafted
// whole from the answer cache, however long, once the repetition has begun.
TEST(SuffixDrafts, AnEarlierAnswerIsDraftedWhole) {
  SpeculativeConfig c;
  c.method = SpecMethod::kSuffix;
  c.suffix_max_tree_depth = 64;
  c.suffix_max_spec_factor = 1.0;  // vLLM's: a draft as long as its match
  SuffixDraftSource src(c);
  std::vector<int32_t> answer;
  for (int i = 0; i < 40; ++i) answer.push_back(1000 + i);
  const std::vector<int32_t> prompt = {1, 2, 3};
  src.release({1, prompt, answer});
  // The new request's output has begun the same answer: 8 tokens match, 8 are drafted
  // (max_spec_factor 1), then 16 once 16 match.
  std::vector<int32_t> drafts;
  const std::vector<int32_t> prompt2 = {4, 5, 6};
  src.propose({2, prompt2, std::span<const int32_t>(answer.data(), 8)}, 20, drafts);
  EXPECT_EQ(drafts, std::vector<int32_t>(answer.begin() + 8, answer.begin() + 16));
  drafts.clear();
  src.propose({2, prompt2, std::span<const int32_t>(answer.data(), 16)}, 20, drafts);
  EXPECT_EQ(drafts, std::vector<int32_t>(answer.begin() + 16, answer.begin() + 32));
  src.release({2, prompt2, answer});
  EXPECT_EQ(src.num_active(), 0u);
  EXPECT_EQ(src.num_cached_answers(), 2u);
  // With no answer cache, the other request's answer is never seen.
  c.suffix_max_cached_requests = 0;
  SuffixDraftSource alone(c);
  alone.release({1, prompt, answer});
  drafts.clear();
  alone.propose({2, prompt2, std::span<const int32_t>(answer.data(), 16)}, 20, drafts);
  EXPECT_TRUE(drafts.empty());
}

// The answer cache is bounded: FIFO by requests (and by tokens), and lists of frequent tokens
// stay usable after many evictions.
TEST(SuffixDrafts, TheAnswerCacheEvictsOldestFirst) {
  SpeculativeConfig c;
  c.method = SpecMethod::kSuffix;
  c.suffix_max_cached_requests = 3;
  SuffixDraftSource src(c);
  const std::vector<int32_t> prompt = {9};
  for (int r = 0; r < 2000; ++r) {
    std::vector<int32_t> answer = {7, 7, 7, static_cast<int32_t>(r), static_cast<int32_t>(r + 1), 7};
    src.release({r, prompt, answer});
  }
  EXPECT_EQ(src.num_cached_answers(), 3u);
  // Only the newest three answers (r = 1997..1999) can be drafted from.
  std::vector<int32_t> drafts;
  const std::vector<int32_t> out = {7, 7, 7, 1998};
  src.propose({5000, prompt, out}, 4, drafts);
  EXPECT_EQ(drafts, (std::vector<int32_t>{1999, 7}));
  drafts.clear();
  const std::vector<int32_t> old = {7, 7, 7, 5};
  src.propose({5001, prompt, old}, 4, drafts);
  EXPECT_TRUE(drafts.empty());
}

}  // namespace
}  // namespace moonrun
