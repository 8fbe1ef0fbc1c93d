#include "engine/scheduler.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <string>

namespace moonrun {

const char* finish_reason_name(FinishReason reason) {
  switch (reason) {
    case FinishReason::kNone: return "";
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kAbort: return "abort";
    case FinishReason::kError: return "error";
  }
  return "";
}

Scheduler::Scheduler(const SchedulerConfig& config, CacheManager& cache) : config_(config), cache_(cache) {
  MR_CHECK(config.max_running_requests >= 1) << "max_running_requests " << config.max_running_requests;
  // Running requests are served oldest first: a budget below one token per running request
  // would starve the newest decodes for as long as the oldest run.
  if (config_.max_tokens_per_step > 0)
    config_.max_tokens_per_step = std::max(config_.max_tokens_per_step, config_.max_running_requests);
}

Status Scheduler::add(Request* req) {
  MR_CHECK(req && req->state == RequestState::kWaiting) << "add() takes a waiting request";
  if (config_.max_queued_requests >= 0 && num_waiting() >= config_.max_queued_requests) {
    return resource_exhausted("the waiting queue is full (" + std::to_string(num_waiting()) +
                              " requests, --max-queued-requests " +
                              std::to_string(config_.max_queued_requests) + "); retry later");
  }
  waiting_.push_back(req);
  return Status::ok();
}

void Scheduler::preempt(Request* victim) {
  cache_.free(victim->seq_id);
  last_paced_chunk_.erase(victim->seq_id);
  victim->state = RequestState::kWaiting;
  victim->num_computed_tokens = 0;
  victim->draft_ids.clear();
  victim->pending_replay = {};  // its state is gone: nothing to roll back
  ++victim->num_preemptions;
  ++num_preemptions_;
  waiting_.push_front(victim);
}

SchedulerOutput Scheduler::schedule() {
  SchedulerOutput out;
  int budget = config_.max_tokens_per_step > 0 ? config_.max_tokens_per_step : INT_MAX;
  // Fair chunking: the step's prefill budget, in the pacer's cost (seconds) or in pairs. A
  // request alone on the server keeps whole chunks: cutting them would slow it and spare no
  // one (its TTFT alone is the baseline fair chunking is held to). Alone means for a while
  // (kFairCompanySteps): company that left a step ago is likely coming back.
  steps_alone_ = running_.size() + waiting_.size() > 1 ? 0 : std::min(steps_alone_ + 1, kFairCompanySteps);
  const bool shared = steps_alone_ < kFairCompanySteps;
  // A pacer's budget at or below zero (its fitted fixed part at the target: the fit is
  // degenerate when every step sits at the target, t0 = target and a = c = 0 explaining them
  // all) leaves no room, not no bound: the prompt advances by the minimum chunk until steps
  // of other sizes correct the fit. Read as unbounded, as it was, each such step took a whole
  // chunk (~1.1 s late in a 1M prompt) past the growth bound: the streams' 1 % of ~1 s gaps.
  const PrefillBudget cost =
      !shared                ? PrefillBudget{}
      : paced_.per_pair > 0  ? PrefillBudget{std::max(paced_.budget, 0.0), paced_.per_token, paced_.per_pair,
                                             paced_.per_context, paced_.fixed}
      : config_.max_prefill_attention_pairs > 0
          ? PrefillBudget{static_cast<double>(config_.max_prefill_attention_pairs), 0.0, 1.0}
          : PrefillBudget{};
  double attention_left = cost.per_pair > 0 ? cost.budget : HUGE_VAL;

  // Running requests: the decodes (one token left to compute) first, then the prefill
  // chunks, each group oldest first, so a long prompt's chunks never hold back the streams
  // already decoding. When the cache is full, the newest running request gives its caches
  // back, as before (a decode of this step is unscheduled for it: a newer decode is worth
  // less than an older prompt's prefix, which would have to be recomputed).
  // A request whose chunk is on the prefill lane is neither scheduled nor preempted here.
  std::vector<Request*> order;
  order.reserve(running_.size());
  for (Request* r : running_)
    if (!r->in_lane && r->num_tokens() - r->num_computed_tokens == 1) order.push_back(r);
  int decodes_left = static_cast<int>(order.size());
  for (Request* r : running_)
    if (!r->in_lane && r->num_tokens() - r->num_computed_tokens != 1) order.push_back(r);
  for (Request* req : order) {
    if (budget <= 0) break;
    if (req->state != RequestState::kRunning) continue;  // preempted for an older request this step
    const bool decode = req->num_tokens() - req->num_computed_tokens == 1;
    if (decode) --decodes_left;
    // Speculative decoding: a decode brings its drafts when the budget keeps a token for
    // every decode after it and the cache has the rows without preempting anyone.
    int n_draft = 0;
    if (decode && !req->draft_ids.empty()) {
      n_draft = std::clamp(budget - 1 - decodes_left, 0, static_cast<int>(req->draft_ids.size()));
      if (n_draft > 0 && !cache_.allocate(req->seq_id, req->num_computed_tokens + 1 + n_draft)) n_draft = 0;
    }
    req->draft_ids.resize(n_draft);
    int n_new = n_draft > 0 ? 1 + n_draft : 1;
    if (!decode) {
      // A prefill chunk: cut to the step's budget (fair chunking), then to a snapshot boundary.
      const int fair = fair_chunk(std::min(req->num_tokens() - req->num_computed_tokens, budget),
                                  req->num_computed_tokens, cost, attention_left, growth_cap(req, attention_left));
      record_chunk(req, fair, attention_left);
      n_new = chunk(req, fair);
    }
    MR_CHECK(n_new > 0) << "running request " << req->seq_id << " has nothing to compute";
    bool fits = false;
    while (true) {
      if (cache_.allocate(req->seq_id, req->num_computed_tokens + n_new)) {
        fits = true;
        break;
      }
      Request* victim = newest_preemptible();
      if (!victim) break;  // only requests on the prefill lane hold the rest: req waits
      running_.erase(std::find(running_.begin(), running_.end(), victim));
      // Scheduled already: one of this step's decodes (a newer prefill comes after req).
      auto s = std::find_if(out.seqs.begin(), out.seqs.end(), [&](const ScheduledSeq& x) { return x.req == victim; });
      if (s != out.seqs.end()) {
        budget += s->n_new_tokens;
        out.n_tokens -= s->n_new_tokens;
        out.seqs.erase(s);
      }
      preempt(victim);
      out.preempted.push_back(victim);
      if (victim == req) break;
    }
    if (!fits) continue;  // req itself was the newest; older ones later in the order may still fit
    plan_snapshot(req, n_new - n_draft);
    if (decode) attention_left -= cost.per_token * n_new;  // a prefill chunk spent its own in fair_chunk
    const bool samples = req->num_computed_tokens + n_new - n_draft == req->num_tokens();
    out.seqs.push_back({req, n_new, samples, n_draft});
    out.n_tokens += n_new;
    budget -= n_new;
  }

  // Newcomers, in arrival order, only when the running set was not squeezed this step.
  if (out.preempted.empty()) {
    while (!waiting_.empty() && budget > 0 && num_running() < config_.max_running_requests) {
      Request* req = waiting_.front();
      MR_CHECK_EQ(req->num_computed_tokens, 0);
      // A cached prefix of the prompt: its pages are shared and its state restored.
      const int cached = req->has_images() ? 0 : cache_.match_prefix(req->seq_id, req->prompt_ids);
      const int n_new = chunk(req, fair_chunk(std::min(req->num_tokens() - cached, budget), cached, cost, attention_left), cached);
      if (!cache_.allocate(req->seq_id, cached + n_new)) {
        cache_.free(req->seq_id);  // gives back what match_prefix shared
        break;
      }
      admit_head(cached, n_new);
      out.seqs.push_back({req, n_new, cached + n_new == req->num_tokens()});
      out.n_tokens += n_new;
      budget -= n_new;
    }
  }
  return out;
}

Request* Scheduler::newest_preemptible() const {
  for (auto it = running_.rbegin(); it != running_.rend(); ++it)
    if (!(*it)->in_lane) return *it;
  return nullptr;
}

ScheduledSeq Scheduler::schedule_lane(Request* req, int max_tokens) {
  MR_CHECK(req && req->state == RequestState::kRunning && !req->in_lane) << "schedule_lane takes a running request";
  const int left = req->num_tokens() - req->num_computed_tokens;
  const int n_new = left > 0 && max_tokens > 0 ? chunk(req, std::min(left, max_tokens)) : 0;
  if (n_new <= 0 || !cache_.allocate(req->seq_id, req->num_computed_tokens + n_new)) return {req, 0, false, 0};
  last_paced_chunk_.erase(req->seq_id);  // the lane's chunks are not paced
  plan_snapshot(req, n_new);
  return {req, n_new, req->num_computed_tokens + n_new == req->num_tokens(), 0};
}

ScheduledSeq Scheduler::admit_to_lane(int max_tokens, int min_prompt_tokens) {
  if (waiting_.empty() || num_running() >= config_.max_running_requests || max_tokens <= 0) return {};
  Request* req = waiting_.front();
  MR_CHECK_EQ(req->num_computed_tokens, 0);
  if (req->has_images() || req->num_prompt_tokens() < min_prompt_tokens) return {};
  const int cached = cache_.match_prefix(req->seq_id, req->prompt_ids);
  const int left = req->num_tokens() - cached;
  const int n_new = left >= 2 ? chunk(req, std::min(left, max_tokens), cached) : 0;
  // Too little left for the lane (the main steps take it), or no room now: as if untried.
  if (n_new <= 0 || !cache_.allocate(req->seq_id, cached + n_new)) {
    cache_.free(req->seq_id);  // gives back what match_prefix shared
    return {};
  }
  admit_head(cached, n_new);
  last_paced_chunk_.erase(req->seq_id);
  return {req, n_new, cached + n_new == req->num_tokens(), 0};
}

void Scheduler::admit_head(int cached, int n_new) {
  Request* req = waiting_.front();
  waiting_.pop_front();
  req->state = RequestState::kRunning;
  req->num_computed_tokens = cached;
  if (req->num_preemptions == 0) req->num_cached_tokens = cached;
  running_.push_back(req);
  plan_snapshot(req, n_new);
}

int Scheduler::growth_cap(const Request* req, double left) const {
  if (left == HUGE_VAL) return INT_MAX;
  const auto it = last_paced_chunk_.find(req->seq_id);
  return it == last_paced_chunk_.end() ? INT_MAX
                                       : std::max(kMinFairChunkTokens, static_cast<int>(it->second * kMaxFairChunkGrowth));
}

void Scheduler::record_chunk(const Request* req, int n, double left) {
  if (left == HUGE_VAL) last_paced_chunk_.erase(req->seq_id);  // unpaced: no cap next time
  else last_paced_chunk_[req->seq_id] = n;
}

int Scheduler::fair_chunk(int n_new, int from, const PrefillBudget& cost, double& left, int cap) const {
  if (left == HUGE_VAL) return n_new;
  n_new = std::min(n_new, cap);
  const auto spent = [&](int64_t n) {
    return cost.per_token * static_cast<double>(n) + cost.per_pair * static_cast<double>(attention_pairs(from, n));
  };
  // The chunk's context part (per_context * from: plain MLA's expansion of the cached
  // latents) comes out of the budget first; where that leaves less work than the step's
  // fixed part plus itself, the chunk gets that much anyway (what budget() does for t0), so
  // a chunk's overhead never exceeds its work and the prompt's TTFT stays within ~2x.
  const double ctx = cost.per_context * static_cast<double>(from);
  if (ctx > 0) {
    const double room = std::max(left - ctx, cost.fixed + ctx);
    left -= ctx;
    double r = room;
    const int cut = fair_chunk(n_new, from, PrefillBudget{cost.budget, cost.per_token, cost.per_pair}, r, INT_MAX);
    left -= room - r;
    return cut;
  }
  // The largest n with spent(n) <= left: the positive root of
  // per_pair / 2 n^2 + (per_pair (from + 1/2) + per_token) n - left = 0, then nudged for
  // the rounding.
  const double qa = cost.per_pair / 2, qb = cost.per_pair * (from + 0.5) + cost.per_token, room = std::max(left, 0.0);
  double root = qa > 0 ? (-qb + std::sqrt(qb * qb + 4 * qa * room)) / (2 * qa) : qb > 0 ? room / qb : n_new;
  int64_t n = static_cast<int64_t>(std::min(root, static_cast<double>(n_new)));
  while (n > 0 && spent(n) > left) --n;
  while (n < n_new && spent(n + 1) <= left) ++n;
  const int cut = static_cast<int>(std::clamp<int64_t>(n, std::min(n_new, kMinFairChunkTokens), n_new));
  left -= spent(cut);
  return cut;
}

int Scheduler::chunk(const Request* req, int n_new, int from) const {
  if (from < 0) from = req->num_computed_tokens;
  if (from >= req->num_prompt_tokens()) return n_new;  // only prompt prefixes are cached
  return cache_.chunk_end(req->prompt_ids, from, from + n_new) - from;
}

void Scheduler::plan_snapshot(const Request* req, int n_new) {
  const int end = req->num_computed_tokens + n_new;
  if (end <= req->num_prompt_tokens() && !req->has_images())
    cache_.plan_snapshot(req->seq_id, std::span<const int32_t>(req->prompt_ids).first(end));
}

void Scheduler::on_step_done(const SchedulerOutput& out) {
  for (const ScheduledSeq& s : out.seqs) {
    s.req->num_computed_tokens += s.n_new_tokens - s.n_draft;  // accepted drafts: Engine::postprocess
    MR_CHECK_LE(s.req->num_computed_tokens, s.req->num_tokens());
  }
}

void Scheduler::remove(Request* req) {
  cache_.free(req->seq_id);
  last_paced_chunk_.erase(req->seq_id);
  auto r = std::find(running_.begin(), running_.end(), req);
  if (r != running_.end()) running_.erase(r);
  auto w = std::find(waiting_.begin(), waiting_.end(), req);
  if (w != waiting_.end()) waiting_.erase(w);
}

}  // namespace moonrun
