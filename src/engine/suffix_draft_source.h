#pragma once
// Suffix decoding (vLLM's `suffix` method; Arctic Inference's SuffixDecoding, arXiv 2411.04975):
// drafts from what followed the sequence's recent tokens before, in the request's own prompt and
// output and in the answers of earlier requests. Agent loops repeat themselves (tool calls,
// file contents, the same plan re-stated), so the draft is often long and right.
//
// The statistics are those of Arctic's depth-limited suffix trees, counted from occurrence lists
// instead of a tree (the tree's node counts are occurrence counts):
//   - for each match length m = 1, 2, ... (while the last m tokens occurred before, m < depth),
//     the occurrences S of those m tokens propose a path: the token that most often follows
//     them, its estimated probability p *= count / |S|, then the occurrences that continued
//     with it, again; the path stops below min_token_prob, at min(k, m x max_spec_factor)
//     tokens, or where match + draft would pass the tree depth;
//   - a path's score is the sum of its tokens' probabilities; the best score wins (a longer
//     match wins ties); the request's own tokens first, earlier answers only when better.
// Where an occurrence list is long (a frequent token), the most recent kMaxOccurrences stand for
// it; matches of kGramTokens or more are looked up by their own n-gram, so long matches are
// found however old (see the .cpp). Drafts never change output (verification keeps only what
// the model would have produced), only how many are accepted.
#include <cstdint>
#include <deque>
#include <unordered_map>
#include <vector>

#include "engine/draft_source.h"

namespace moonrun {

// Token sequences with occurrence lists: token -> where it occurs, and n-gram -> where it ends.
// Sequences are added and evicted first in, first out; evicted entries are skipped and the
// lists rebuilt once they are half dead.
class SuffixCorpus {
 public:
  static constexpr int kGramTokens = 6;        // matches this long and longer: the n-gram's list
  static constexpr int kMaxOccurrences = 256;  // per list, the most recent

  struct Occurrence {
    uint32_t seq;  // sequence id
    uint32_t end;  // index of the occurrence's last token in that sequence
  };
  // The continuation statistics of one match: see the file comment.
  struct Draft {
    std::vector<int32_t> tokens;
    double score = 0;
    int match_len = 0;
  };

  uint32_t add_sequence();  // a new empty sequence, the newest
  void append(uint32_t seq, std::span<const int32_t> tokens);
  void evict_oldest();
  bool contains(uint32_t seq) const { return seq >= first_id_ && seq - first_id_ < seqs_.size(); }
  size_t num_sequences() const { return seqs_.size(); }
  int64_t num_tokens() const { return live_tokens_; }
  std::span<const int32_t> tokens(uint32_t seq) const { return seqs_[seq - first_id_]; }

  // The best draft to follow `pattern` (its tail is what must match).
  Draft speculate(std::span<const int32_t> pattern, int max_tokens, int max_depth, double max_spec_factor,
                  double min_token_prob) const;

 private:
  static uint64_t gram_key(const int32_t* last_token);  // the kGramTokens tokens ending there
  void index(uint32_t seq, uint32_t end);
  void rebuild();
  std::vector<Occurrence> recent(const std::vector<Occurrence>* list) const;
  Draft follow(std::vector<Occurrence> occ, int match_len, int max_tokens, double min_token_prob) const;

  std::deque<std::vector<int32_t>> seqs_;  // seqs_[i] is sequence first_id_ + i
  uint32_t first_id_ = 0;
  std::unordered_map<int32_t, std::vector<Occurrence>> by_token_;
  std::unordered_map<uint64_t, std::vector<Occurrence>> by_gram_;
  int64_t live_tokens_ = 0, dead_entries_ = 0;
};

class SuffixDraftSource final : public DraftSource {
 public:
  // Whatever max_cached_requests says, earlier answers hold at most this many tokens (~40 bytes
  // each with their lists): a bound on the server's memory Arctic does not have.
  static constexpr int64_t kMaxCachedTokens = int64_t{1} << 22;

  explicit SuffixDraftSource(const SpeculativeConfig& config);
  void propose(const DraftRequest& request, int max_tokens, std::vector<int32_t>& drafts) override;
  void release(const DraftRequest& request) override;

  size_t num_active() const { return active_.size(); }
  size_t num_cached_answers() const { return answers_.num_sequences(); }

 private:
  struct Active {
    SuffixCorpus own;            // prompt + output so far, one sequence
    uint32_t answer = 0;         // its sequence among answers_ (while not evicted)
    size_t output_indexed = 0;   // output tokens added so far
  };
  Active& track(const DraftRequest& request);
  void add_output(Active& a, std::span<const int32_t> output);
  void trim_answers();

  int max_depth_, max_cached_requests_;
  double max_spec_factor_, min_token_prob_;
  std::unordered_map<int64_t, Active> active_;
  SuffixCorpus answers_;  // earlier and current requests' outputs (Arctic's global tree)
};

}  // namespace moonrun
