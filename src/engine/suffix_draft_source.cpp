#include "engine/suffix_draft_source.h"

#include <algorithm>

namespace moonrun {

// ---- SuffixCorpus ------------------------------------------------------------------------

uint32_t SuffixCorpus::add_sequence() {
  seqs_.emplace_back();
  return first_id_ + static_cast<uint32_t>(seqs_.size() - 1);
}

uint64_t SuffixCorpus::gram_key(const int32_t* last_token) {
  uint64_t h = 0x9e3779b97f4a7c15ull;
  for (int i = 0; i < kGramTokens; ++i) {
    h ^= static_cast<uint32_t>(last_token[-i]);
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 29;
  }
  return h;
}

void SuffixCorpus::index(uint32_t seq, uint32_t end) {
  const std::vector<int32_t>& s = seqs_[seq - first_id_];
  by_token_[s[end]].push_back({seq, end});
  if (end + 1 >= static_cast<uint32_t>(kGramTokens)) by_gram_[gram_key(&s[end])].push_back({seq, end});
}

void SuffixCorpus::append(uint32_t seq, std::span<const int32_t> tokens) {
  std::vector<int32_t>& s = seqs_[seq - first_id_];
  for (int32_t t : tokens) {
    s.push_back(t);
    index(seq, static_cast<uint32_t>(s.size() - 1));
  }
  live_tokens_ += static_cast<int64_t>(tokens.size());
}

void SuffixCorpus::evict_oldest() {
  if (seqs_.empty()) return;
  const int64_t n = static_cast<int64_t>(seqs_.front().size());
  live_tokens_ -= n;
  dead_entries_ += 2 * n;  // its token entries and (about as many) n-gram entries
  seqs_.pop_front();
  ++first_id_;
  // Evicted entries are skipped where met; once they outnumber the live ones (about two a
  // token), the lists are rebuilt: amortized O(1) a token.
  if (dead_entries_ > 2 * live_tokens_ + 4096) rebuild();
}

void SuffixCorpus::rebuild() {
  by_token_.clear();
  by_gram_.clear();
  for (size_t i = 0; i < seqs_.size(); ++i)
    for (size_t e = 0; e < seqs_[i].size(); ++e) index(first_id_ + static_cast<uint32_t>(i), static_cast<uint32_t>(e));
  dead_entries_ = 0;
}

std::vector<SuffixCorpus::Occurrence> SuffixCorpus::recent(const std::vector<Occurrence>* list) const {
  std::vector<Occurrence> out;
  if (!list) return out;
  // Lists grow in time order and evict from the front, so the live, recent ones are last.
  for (auto it = list->rbegin(); it != list->rend() && static_cast<int>(out.size()) < kMaxOccurrences; ++it)
    if (contains(it->seq)) out.push_back(*it);
  std::reverse(out.begin(), out.end());  // oldest first: later means more recent in ties
  return out;
}

SuffixCorpus::Draft SuffixCorpus::follow(std::vector<Occurrence> occ, int match_len, int max_tokens,
                                         double min_token_prob) const {
  Draft d;
  d.match_len = match_len;
  double prob = 1.0;
  std::vector<std::pair<int32_t, int>> next;  // (token, index into occ: its recency)
  for (int j = 0; j < max_tokens; ++j) {
    next.clear();
    for (size_t i = 0; i < occ.size(); ++i) {
      const std::span<const int32_t> s = tokens(occ[i].seq);
      const size_t at = static_cast<size_t>(occ[i].end) + 1 + j;
      if (at < s.size()) next.emplace_back(s[at], static_cast<int>(i));
    }
    if (next.empty()) break;
    // The most frequent continuation; among equals the one seen most recently.
    std::sort(next.begin(), next.end());
    int32_t best = 0;
    int best_count = 0, best_recency = -1;
    for (size_t a = 0; a < next.size();) {
      size_t b = a;
      while (b < next.size() && next[b].first == next[a].first) ++b;
      const int count = static_cast<int>(b - a), recency = next[b - 1].second;
      if (count > best_count || (count == best_count && recency > best_recency)) {
        best = next[a].first;
        best_count = count;
        best_recency = recency;
      }
      a = b;
    }
    // Occurrences that end here (no continuation yet) count in the denominator, as a suffix
    // tree's node count includes the suffixes that end at the node.
    prob *= static_cast<double>(best_count) / static_cast<double>(occ.size());
    if (prob < min_token_prob) break;
    d.tokens.push_back(best);
    d.score += prob;
    std::vector<Occurrence> kept;
    kept.reserve(best_count);
    for (const auto& [token, i] : next)  // sorted by (token, i): occ's order is kept
      if (token == best) kept.push_back(occ[i]);
    occ = std::move(kept);
  }
  return d;
}

SuffixCorpus::Draft SuffixCorpus::speculate(std::span<const int32_t> pattern, int max_tokens, int max_depth,
                                            double max_spec_factor, double min_token_prob) const {
  Draft best;
  const int L = static_cast<int>(pattern.size());
  if (L < 2 || max_tokens <= 0) return best;
  const int max_match = std::min(L - 1, max_depth - 1);  // Arctic: match < context <= depth
  std::vector<Occurrence> occ;
  bool token_list_cut = false;
  for (int m = 1; m <= max_match; ++m) {
    if (m == 1) {
      auto it = by_token_.find(pattern[L - 1]);
      const std::vector<Occurrence>* list = it == by_token_.end() ? nullptr : &it->second;
      occ = recent(list);
      token_list_cut = list && static_cast<int>(list->size()) > kMaxOccurrences;
    } else if (m == kGramTokens) {
      // Long matches by their own n-gram's list: however old, they are found.
      auto it = by_gram_.find(gram_key(&pattern[L - 1]));
      occ = recent(it == by_gram_.end() ? nullptr : &it->second);
      std::erase_if(occ, [&](const Occurrence& o) {
        const std::span<const int32_t> s = tokens(o.seq);
        for (int i = 0; i < m; ++i)
          if (s[o.end - i] != pattern[L - 1 - i]) return true;  // a hash collision
        return false;
      });
    } else {
      std::erase_if(occ, [&](const Occurrence& o) {
        return o.end < static_cast<uint32_t>(m - 1) || tokens(o.seq)[o.end - (m - 1)] != pattern[L - m];
      });
    }
    if (occ.empty()) {
      // The recent sample of a frequent token ran out; older occurrences of a long match may
      // still be found by the n-gram's list.
      if (token_list_cut && m < kGramTokens - 1 && kGramTokens <= max_match) {
        m = kGramTokens - 1;
        continue;
      }
      break;
    }
    int limit = std::min(max_tokens, static_cast<int>(m * max_spec_factor + 1e-6));
    limit = std::min(limit, max_depth - m);  // the tree holds match + draft <= depth tokens
    if (limit <= 0) continue;
    Draft d = follow(occ, m, limit, min_token_prob);
    if (d.score >= best.score) best = std::move(d);
  }
  return best;
}

// ---- SuffixDraftSource -------------------------------------------------------------------

namespace {
// A prompt longer than this is indexed by its tail only: building the lists is work on the
// engine thread (~100 ns a token), so a 1M-token prompt must not stall every stream for it.
constexpr size_t kMaxPromptTokens = size_t{1} << 18;
}  // namespace

SuffixDraftSource::SuffixDraftSource(const SpeculativeConfig& config)
    : max_depth_(config.suffix_max_tree_depth),
      max_cached_requests_(config.suffix_max_cached_requests),
      max_spec_factor_(config.suffix_max_spec_factor),
      min_token_prob_(config.suffix_min_token_prob) {}

void SuffixDraftSource::trim_answers() {
  while (answers_.num_sequences() > 1 &&
         (static_cast<int64_t>(answers_.num_sequences()) > max_cached_requests_ ||
          answers_.num_tokens() > kMaxCachedTokens)) {
    // First in, first out; the answer being added is the newest, so never the one evicted.
    answers_.evict_oldest();
  }
}

SuffixDraftSource::Active& SuffixDraftSource::track(const DraftRequest& request) {
  auto [it, inserted] = active_.try_emplace(request.seq_id);
  Active& a = it->second;
  if (inserted) {
    const uint32_t own = a.own.add_sequence();
    const std::span<const int32_t> prompt = request.prompt.size() > kMaxPromptTokens
                                                ? request.prompt.subspan(request.prompt.size() - kMaxPromptTokens)
                                                : request.prompt;
    a.own.append(own, prompt);
    if (max_cached_requests_ > 0) {
      a.answer = answers_.add_sequence();
      trim_answers();
    }
  }
  return a;
}

void SuffixDraftSource::add_output(Active& a, std::span<const int32_t> output) {
  if (output.size() <= a.output_indexed) return;
  const std::span<const int32_t> fresh = output.subspan(a.output_indexed);
  a.own.append(0, fresh);
  // Its answer may have been evicted already by newer requests: then only the request sees it.
  if (max_cached_requests_ > 0 && answers_.contains(a.answer)) {
    answers_.append(a.answer, fresh);
    trim_answers();
  }
  a.output_indexed = output.size();
}

void SuffixDraftSource::propose(const DraftRequest& request, int max_tokens, std::vector<int32_t>& drafts) {
  if (max_tokens <= 0) return;
  Active& a = track(request);
  add_output(a, request.output);
  const std::span<const int32_t> seq = a.own.tokens(0);
  const std::span<const int32_t> pattern =
      seq.size() > static_cast<size_t>(max_depth_) ? seq.subspan(seq.size() - max_depth_) : seq;
  SuffixCorpus::Draft best = a.own.speculate(pattern, max_tokens, max_depth_, max_spec_factor_, min_token_prob_);
  if (max_cached_requests_ > 0) {
    SuffixCorpus::Draft other = answers_.speculate(pattern, max_tokens, max_depth_, max_spec_factor_, min_token_prob_);
    if (other.score > best.score) best = std::move(other);
  }
  for (int32_t t : best.tokens) {
    if (static_cast<int>(drafts.size()) >= max_tokens) break;
    drafts.push_back(t);
  }
}

void SuffixDraftSource::release(const DraftRequest& request) {
  auto it = active_.find(request.seq_id);
  if (it != active_.end()) {
    add_output(it->second, request.output);
    active_.erase(it);
    return;
  }
  // Never drafted for (structured output, a large batch, one token): its answer still teaches.
  if (max_cached_requests_ > 0 && !request.output.empty()) {
    const uint32_t id = answers_.add_sequence();
    answers_.append(id, request.output);
    trim_answers();
  }
}

}  // namespace moonrun
