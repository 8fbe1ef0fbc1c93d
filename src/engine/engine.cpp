#include "engine/engine.h"

#include <algorithm>
#include <chrono>
#include <span>
#include <string>

#include "common/debug_phases.h"
#include "common/log.h"

namespace moonrun {

Status check_engine_config(const EngineConfig& config, const CacheConfig& cache) {
  if (config.max_model_len < 2)
    return invalid_argument("--context-length must be >= 2 tokens, got " + std::to_string(config.max_model_len));
  if (config.max_model_len > cache.total_tokens()) {
    return invalid_argument("--context-length " + std::to_string(config.max_model_len) +
                            " exceeds the KV pool (" + std::to_string(cache.total_tokens()) +
                            " tokens); lower it or give the cache more memory (--mem-fraction-static)");
  }
  if (config.scheduler.max_running_requests < 1)
    return invalid_argument("--max-running-requests must be >= 1, got " +
                            std::to_string(config.scheduler.max_running_requests));
  if (cache.num_state_slots < 1) return invalid_argument("the cache has no state slot");
  MR_RETURN_IF_ERROR(check_speculative_config(config.speculative));
  if (config.speculative.enabled() && cache.layout.state_bytes_per_slot > 0 && cache.num_verify_slots == 0)
    return invalid_argument("speculative decoding on a model with a recurrent state needs the cache's verify slots");
  return Status::ok();
}

Result<EngineConfig> resolve_engine_config(EngineConfig wanted, int64_t model_max_len, const CacheConfig& cache) {
  if (wanted.max_model_len <= 0) {
    const int64_t pool = cache.total_tokens();
    wanted.max_model_len = static_cast<int>(std::min<int64_t>(model_max_len > 0 ? model_max_len : pool, pool));
  }
  MR_RETURN_IF_ERROR(check_engine_config(wanted, cache));
  return wanted;
}

Engine::Engine(const EngineConfig& config, CacheManager& cache, StepRunner& runner, DetokenizeFn detokenize)
    : config_(config),
      cache_(cache),
      runner_(runner),
      detokenize_(std::move(detokenize)),
      scheduler_([&] {
        // A running request holds a state slot for its whole life: never admit more requests
        // than there are slots.
        SchedulerConfig s = config.scheduler;
        s.max_running_requests = std::min(s.max_running_requests, cache.config().num_state_slots);
        return s;
      }(), cache),
      drafts_(make_draft_source(config.speculative)),
      seed_gen_(config.seed) {
  const Status st = check_engine_config(config, cache.config());
  MR_CHECK(st.is_ok()) << st.message();
  pacer_.set_context_pairs(config.prefill_context_pairs);
}

Engine::~Engine() {
  if (lane_job_) (void)lane()->take();  // the lane reads lane_job_'s input until it is done
}

Status Engine::validate(const std::vector<int32_t>& prompt_ids, const SamplingParams& params) const {
  MR_RETURN_IF_ERROR(params.validate());
  if (prompt_ids.empty()) return invalid_argument("the prompt is empty (at least one token is needed)");
  const int vocab = runner_.vocab();
  for (size_t i = 0; i < prompt_ids.size(); ++i) {
    if (prompt_ids[i] < 0 || prompt_ids[i] >= vocab)
      return invalid_argument("prompt token " + std::to_string(i) + " is " + std::to_string(prompt_ids[i]) +
                              ", outside the vocabulary [0, " + std::to_string(vocab) + ")");
  }
  for (const auto& [token, bias] : params.logit_bias)
    if (token < 0 || token >= vocab)
      return invalid_argument("logit_bias: token " + std::to_string(token) + " is outside the vocabulary [0, " +
                              std::to_string(vocab) + ")");
  const int64_t n_prompt = static_cast<int64_t>(prompt_ids.size());
  if (n_prompt >= config_.max_model_len) {
    return out_of_range("the prompt has " + std::to_string(n_prompt) + " tokens; the context length is " +
                        std::to_string(config_.max_model_len) + " (prompt + output)");
  }
  if (params.max_tokens > 0 && n_prompt + params.max_tokens > config_.max_model_len) {
    return out_of_range("the prompt (" + std::to_string(n_prompt) + " tokens) plus max_tokens (" +
                        std::to_string(params.max_tokens) + ") exceed the context length of " +
                        std::to_string(config_.max_model_len) + " tokens");
  }
  return Status::ok();
}

Status Engine::add_request(uint64_t request_id, std::vector<int32_t> prompt_ids, const SamplingParams& params,
                           std::shared_ptr<const vision::PromptImages> images) {
  MR_RETURN_IF_ERROR(validate(prompt_ids, params));
  if (has_request(request_id)) return invalid_argument("duplicate request id " + std::to_string(request_id));
  const int max_queued = scheduler_.config().max_queued_requests;
  if (max_queued >= 0 && scheduler_.num_waiting() + params.n > max_queued) {
    return resource_exhausted("the waiting queue is full (" + std::to_string(scheduler_.num_waiting()) +
                              " waiting, --max-queued-requests " + std::to_string(max_queued) + "); retry later");
  }
  std::vector<int32_t> image_positions;
  std::shared_ptr<const std::vector<float>> image_rows;
  if (images && !images->images.empty()) {
    image_positions = vision::placeholder_positions(prompt_ids, images->placeholder_id);
    if (static_cast<int>(image_positions.size()) != images->num_tokens())
      return invalid_argument("images: the prompt holds " + std::to_string(image_positions.size()) +
                              " media placeholder tokens for images of " + std::to_string(images->num_tokens()) +
                              " rows");
    const auto pointers = images->pointers();
    image_rows = std::make_shared<const std::vector<float>>(MR_TRY(runner_.encode_images(pointers)));
  }
  std::vector<int64_t>& group = groups_[request_id];
  for (int i = 0; i < params.n; ++i) {
    auto req = std::make_unique<Request>();
    req->seq_id = next_seq_id_++;
    req->group_id = request_id;
    req->index = i;
    req->prompt_ids = prompt_ids;
    req->params = params;
    req->params.n = 1;
    // vLLM's parallel sampling: sample i of a seeded request uses seed + i.
    req->sampler = SequenceSampler(req->params, params.seed ? *params.seed + i : seed_gen_(), req->prompt_ids);
    req->max_output_tokens =
        params.max_tokens > 0 ? params.max_tokens : config_.max_model_len - req->num_prompt_tokens();
    req->text = OutputText(detokenize_, params.stop, params.include_stop_str_in_output);
    if (params.make_constraint) req->constraint = params.make_constraint();
    req->image_positions = image_positions;
    req->image_rows = image_rows;
    const Status st = scheduler_.add(req.get());
    MR_CHECK(st.is_ok()) << st.message();  // room was checked above
    totals_.prompt_tokens_total += req->num_prompt_tokens();
    group.push_back(req->seq_id);
    requests_.emplace(req->seq_id, std::move(req));
  }
  return Status::ok();
}

bool Engine::is_eos(int32_t token) const {
  return std::find(config_.eos_token_ids.begin(), config_.eos_token_ids.end(), token) != config_.eos_token_ids.end();
}

RequestOutput Engine::finish(Request* req, FinishReason reason, std::string text_delta) {
  scheduler_.remove(req);  // frees its pages and slot now
  if (drafts_) drafts_->release({req->seq_id, req->prompt_ids, req->output_ids});
  req->state = RequestState::kFinished;
  req->finish_reason = reason;
  RequestOutput out;
  out.request_id = req->group_id;
  out.index = req->index;
  out.text_delta = std::move(text_delta);
  out.finished = true;
  out.finish_reason = reason;
  out.stop_reason = req->stop_reason;
  out.num_prompt_tokens = req->num_prompt_tokens();
  out.num_output_tokens = req->num_output_tokens();
  out.num_cached_tokens = req->num_cached_tokens;
  ++totals_.requests_finished_total;
  return out;
}

void Engine::abort_request(uint64_t request_id, std::vector<RequestOutput>& outputs) {
  auto it = groups_.find(request_id);
  if (it == groups_.end()) return;
  // A chunk on the prefill lane writes the request's pages until it is done: they are freed
  // after it (the wait is one chunk's, bounded by --chunked-prefill-size).
  if (lane_job_ && std::find(it->second.begin(), it->second.end(), lane_job_->req->seq_id) != it->second.end()) {
    const Status st = collect_lane(outputs, std::chrono::microseconds::max());
    if (!st.is_ok() && lane_failure_.is_ok()) lane_failure_ = st;
    it = groups_.find(request_id);  // the chunk may have finished the request
    if (it == groups_.end()) return;
  }
  for (int64_t seq : it->second) {
    auto r = requests_.find(seq);
    if (r == requests_.end()) continue;  // this sample already finished
    outputs.push_back(finish(r->second.get(), FinishReason::kAbort, r->second->text.take_delta(true)));
    requests_.erase(r);
  }
  groups_.erase(it);
}

void Engine::fail_all(const Status& error, std::vector<RequestOutput>& outputs) {
  if (lane_job_) {
    (void)lane()->take();  // its pages are freed below
    lane_job_->req->in_lane = false;
    lane_job_.reset();
  }
  for (auto& [seq, req] : requests_) {
    RequestOutput out = finish(req.get(), FinishReason::kError, {});
    out.error = error;
    outputs.push_back(std::move(out));
  }
  requests_.clear();
  groups_.clear();
}

// ---- the step ------------------------------------------------------------------------

Status Engine::propose_drafts() {
  const bool dspark = config_.speculative.enabled() && config_.speculative.method == SpecMethod::kDSpark;
  if (!drafts_ && !dspark) return Status::ok();
  const SpeculativeConfig& sc = config_.speculative;
  int decoding = 0;
  for (const Request* r : scheduler_.running()) decoding += r->num_tokens() - r->num_computed_tokens == 1 ? 1 : 0;
  bool stand_aside = sc.disable_by_batch_size > 0 && decoding >= sc.disable_by_batch_size;
  if (sc.disable_by_batch_size == 0 && config_.auto_stand_aside && decoding > 0)
    stand_aside = !balance_.speculate(decoding);
  step_speculates_ = !stand_aside;
  step_decoding_ = decoding;
  std::vector<Request*> blocks_for;  // DSpark: the sequences whose blocks the runner drafts
  std::vector<DraftBlockRequest> blocks;
  for (Request* r : scheduler_.running()) {
    r->draft_ids.clear();
    if (stand_aside || r->num_tokens() - r->num_computed_tokens != 1) continue;
    // Structured output: the drafts the constraint allows, up to the first it refuses (its
    // mask would make that row's token differ anyway); prepare_inputs masks each row.
    std::unique_ptr<TokenConstraint> walk = r->constraint ? r->constraint->clone() : nullptr;
    if (r->constraint && !walk) continue;
    // Drafts past max_tokens or the context could never all be kept.
    const int room = std::min(r->max_output_tokens - r->num_output_tokens() - 1, config_.max_model_len - r->num_tokens());
    const int k = std::min(sc.num_speculative_tokens, room);
    if (k > 0 && dspark) {
      // The anchor is the last token, not yet through the model: its position is the
      // number of tokens in the caches.
      blocks_for.push_back(r);
      blocks.push_back({cache_.page_table(r->seq_id), r->token_at(r->num_tokens() - 1), r->num_computed_tokens, k});
      continue;
    }
    if (k > 0) drafts_->propose({r->seq_id, r->prompt_ids, r->output_ids}, k, r->draft_ids);
    if (walk) {
      size_t allowed = 0;
      while (allowed < r->draft_ids.size() && !walk->finished() && walk->accept(r->draft_ids[allowed])) ++allowed;
      r->draft_ids.resize(allowed);
    }
  }
  if (!blocks.empty()) {
    std::vector<DraftBlockResult> results;
    MR_RETURN_IF_ERROR(runner_.propose_blocks(blocks, results));
    const double threshold = config_.speculative.dspark_confidence_threshold;
    for (size_t i = 0; i < blocks_for.size(); ++i) {
      Request* r = blocks_for[i];
      const DraftBlockResult& res = results[i];
      size_t keep = res.tokens.size();
      // The confidence head estimates each slot's chance of acceptance: stop where it drops.
      if (threshold > 0)
        for (size_t j = 0; j < res.confidence.size() && j < keep; ++j)
          if (res.confidence[j] < threshold) keep = j;
      r->draft_ids.assign(res.tokens.begin(), res.tokens.begin() + keep);
      if (r->constraint) {
        std::unique_ptr<TokenConstraint> walk = r->constraint->clone();
        size_t allowed = 0;
        while (walk && allowed < r->draft_ids.size() && !walk->finished() && walk->accept(r->draft_ids[allowed]))
          ++allowed;
        r->draft_ids.resize(walk ? allowed : 0);
      }
    }
  }
  if (config_.pad_drafts) pad_drafts();
  bool any = false;
  for (const Request* r : scheduler_.running()) any = any || !r->draft_ids.empty();
  // A step that found no draft is a plain step, and the balance measures it as one: counted
  // with the verify steps, the steps where a draft source (n-gram, suffix) finds nothing
  // (most of a chat answer) would make speculation's rate a mix of both, and the verdict
  // would turn on how often drafts are found rather than on what a verify step yields.
  if (!any) step_speculates_ = false;
  if (decoding > 0) {
    if (stand_aside) ++totals_.spec_stand_aside_steps_total;
    else if (!any) ++totals_.spec_steps_without_drafts_total;
  }
  return Status::ok();
}

void Engine::pad_drafts() {
  // Every decoding sequence that may hold them gets the longest draft run of the step, so the
  // verify step is uniform (one CUDA graph). The filler repeats the sequence's last token (or
  // draft): a guess like any other, accepted only where the model agrees. Sequences under a
  // constraint keep theirs (a filler could be one their automaton refuses).
  size_t longest = 0;
  for (const Request* r : scheduler_.running()) longest = std::max(longest, r->draft_ids.size());
  if (longest == 0) return;
  for (Request* r : scheduler_.running()) {
    if (r->constraint || r->num_tokens() - r->num_computed_tokens != 1 || r->draft_ids.size() >= longest) continue;
    const int room = std::min(r->max_output_tokens - r->num_output_tokens() - 1, config_.max_model_len - r->num_tokens());
    const int32_t filler = r->draft_ids.empty() ? r->token_at(r->num_tokens() - 1) : r->draft_ids.back();
    while (r->draft_ids.size() < longest && static_cast<int>(r->draft_ids.size()) < room) r->draft_ids.push_back(filler);
  }
}

SchedulerOutput Engine::schedule() {
  SchedulerOutput out = scheduler_.schedule();
  const auto now = std::chrono::steady_clock::now();
  for (const ScheduledSeq& s : out.seqs)
    if (s.req->first_scheduled_time == std::chrono::steady_clock::time_point{}) s.req->first_scheduled_time = now;
  return out;
}

void Engine::prepare_inputs(const SchedulerOutput& scheduled, StepInput& input) {
  input.seqs.clear();
  input.sampling = SamplingBatch{};
  input.replays.clear();
  // The rollbacks the last step left (drafts it rejected), first of all: the saved rows they
  // read are overwritten by this step's forward.
  for (Request* r : scheduler_.running()) {
    if (r->pending_replay.n_tokens > 0)
      input.replays.push_back({cache_.state_slot(r->seq_id), cache_.verify_slot(r->seq_id), r->pending_replay.first_row,
                               r->pending_replay.n_tokens});
    r->pending_replay = {};
  }
  std::vector<StateCopy> keep;  // the states verifying sequences start from
  int saved_rows = 0;           // the runner saves each verifying sequence's rows, in order
  spec_first_row_.assign(scheduled.seqs.size(), -1);
  step_tokens_.resize(scheduled.seqs.size());
  step_given_.resize(scheduled.seqs.size());
  for (size_t i = 0; i < scheduled.seqs.size(); ++i) {
    const ScheduledSeq& s = scheduled.seqs[i];
    Request* req = s.req;
    std::vector<int32_t>& ids = step_tokens_[i];
    ids.clear();
    const int n_known = s.n_new_tokens - s.n_draft;
    for (int t = 0; t < n_known; ++t) ids.push_back(req->token_at(req->num_computed_tokens + t));
    ids.insert(ids.end(), req->draft_ids.begin(), req->draft_ids.begin() + s.n_draft);
    StepSeq seq;
    seq.new_token_ids = ids;
    seq.n_draft = s.n_draft;
    if (req->has_images()) {
      // The image rows whose positions this chunk covers: a contiguous run of them.
      const int from = req->num_computed_tokens, to = from + s.n_new_tokens;
      const auto& pos = req->image_positions;
      const size_t lo = std::lower_bound(pos.begin(), pos.end(), from) - pos.begin();
      const size_t hi = std::lower_bound(pos.begin(), pos.end(), to) - pos.begin();
      std::vector<int32_t>& given = step_given_[i];
      given.clear();
      for (size_t k = lo; k < hi; ++k) given.push_back(pos[k] - from);
      const size_t hidden = req->image_rows->size() / pos.size();
      seq.given_at = given;
      seq.given_rows = std::span<const float>(*req->image_rows).subspan(lo * hidden, (hi - lo) * hidden);
    }
    seq.n_past = req->num_computed_tokens;
    seq.state_slot = cache_.state_slot(req->seq_id);
    seq.pages = cache_.page_table(req->seq_id);
    seq.sample = s.samples;
    if (s.samples) {
      // Row j picks the token after draft j - 1, as if the drafts before it were accepted
      // (the penalties count them, min_tokens sees them, the output constraint has read
      // them); the verdict is postprocess's.
      add_sampling_row(*req, input.sampling, 0, req->constraint.get());
      std::unique_ptr<TokenConstraint> ahead = s.n_draft > 0 && req->constraint ? req->constraint->clone() : nullptr;
      for (int j = 0; j < s.n_draft; ++j) {
        req->sampler.accept(req->draft_ids[j]);
        if (ahead) ahead->accept(req->draft_ids[j]);  // allowed: propose_drafts walked them
        add_sampling_row(*req, input.sampling, j + 1, ahead.get());
      }
      for (int j = 0; j < s.n_draft; ++j) req->sampler.unaccept(req->draft_ids[j]);
    }
    if (s.n_draft > 0) {
      spec_first_row_[i] = saved_rows;
      saved_rows += s.n_new_tokens;
      const int verify = cache_.verify_slot(req->seq_id);
      if (verify >= 0) keep.push_back({seq.state_slot, verify});
    }
    input.seqs.push_back(seq);
  }
  // The state slots' commands: zero a fresh slot or restore a cached prefix's snapshot
  // before the forward, snapshot a prefix after it.
  cache_.take_state_copies(input.before, input.after);
  input.before.insert(input.before.end(), keep.begin(), keep.end());
}

void Engine::add_sampling_row(Request& req, SamplingBatch& sampling, int ahead, TokenConstraint* constraint) {
  // EOS and stop tokens may not come before min_tokens.
  banned_.clear();
  if (!req.params.ignore_eos) banned_ = config_.eos_token_ids;
  banned_.insert(banned_.end(), req.params.stop_token_ids.begin(), req.params.stop_token_ids.end());
  if (!constraint) {
    req.sampler.add_row(sampling, req.num_output_tokens() + ahead, banned_);
    return;
  }
  // Structured output: the constraint's mask of allowed tokens. When it allows nothing the
  // bans leave (it is done, or min_tokens hides what it wants), the sequence ends: EOS.
  const int vocab = runner_.vocab();
  mask_.assign(static_cast<size_t>((vocab + 31) / 32), 0u);
  if (!constraint->finished()) constraint->fill_allowed(mask_);
  bool any = false;
  for (size_t w = 0; w < mask_.size() && !any; ++w) {
    uint32_t bits = mask_[w];
    for (int32_t t : banned_)
      if (t >= 0 && static_cast<size_t>(t / 32) == w) bits &= ~(1u << (t % 32));
    any = bits != 0;
  }
  if (!any) {
    banned_.clear();
    for (int32_t t : config_.eos_token_ids)
      if (t >= 0 && t < vocab) mask_[t / 32] |= 1u << (t % 32);
  }
  req.sampler.add_row(sampling, req.num_output_tokens() + ahead, banned_, mask_);
}

Status Engine::forward(const StepInput& input, StepOutput& output) {
  MR_RETURN_IF_ERROR(runner_.step(input, output));
  size_t n_sampling = 0;
  for (const StepSeq& s : input.seqs) n_sampling += s.sample ? 1 + s.n_draft : 0;
  if (output.samples.size() != n_sampling)
    return internal_error("model runner returned " + std::to_string(output.samples.size()) + " tokens for " +
                          std::to_string(n_sampling) + " sampling sequences");
  return Status::ok();
}

void Engine::postprocess(const SchedulerOutput& scheduled, const StepOutput& result,
                         std::vector<RequestOutput>& outputs) {
  scheduler_.on_step_done(scheduled);  // the known tokens of each sequence are computed now
  size_t next_sample = 0;
  for (size_t i = 0; i < scheduled.seqs.size(); ++i) {
    const ScheduledSeq& s = scheduled.seqs[i];
    if (!s.samples) continue;
    Request* req = s.req;
    const size_t first_sample = next_sample;
    next_sample += 1 + static_cast<size_t>(s.n_draft);

    // Row j is the model's token after draft j - 1: it is kept, and while it equals draft j
    // (accepted: its cache rows are right) the next row is read too. Greedy rows make this
    // exact; a sampled row against a draft that is one token for sure is rejection sampling
    // (accept with probability p(draft), else a draw from p without it), what each row's own
    // draw already is.
    FinishReason reason = FinishReason::kNone;
    int accepted = 0;
    std::vector<int32_t> new_ids;
    std::vector<SampleResult> logprobs;
    for (int j = 0; j <= s.n_draft; ++j) {
      const SampleResult& sample = result.samples[first_sample + j];
      const int32_t token = sample.token;
      req->sampler.accept(token);
      if (req->constraint && !req->constraint->accept(token))
        MR_LOG(WARNING) << "request " << req->group_id << ": sampled token " << token << " outside its constraint";
      req->output_ids.push_back(token);
      ++totals_.generation_tokens_total;
      new_ids.push_back(token);
      if (req->params.logprobs >= 0) logprobs.push_back(sample);

      // vLLM's order: the length cap first, then eos, then stop tokens, then stop strings.
      bool stopped_by_token = false;
      if (req->num_output_tokens() >= req->max_output_tokens || req->num_tokens() >= config_.max_model_len) {
        reason = FinishReason::kLength;
      } else if ((!req->params.ignore_eos && is_eos(token)) ||
                 std::find(req->params.stop_token_ids.begin(), req->params.stop_token_ids.end(), token) !=
                     req->params.stop_token_ids.end()) {
        reason = FinishReason::kStop;
        stopped_by_token = true;
      }
      // A stop token ends the text without being part of it; so does a skipped special.
      const bool skipped = req->params.skip_special_tokens && config_.is_special_token &&
                           config_.is_special_token(token);
      if (!stopped_by_token && !skipped && req->text.append(token)) {
        reason = FinishReason::kStop;
        req->stop_reason = req->text.matched_stop();
      }
      if (reason != FinishReason::kNone || j == s.n_draft || token != req->draft_ids[j]) break;
      ++accepted;
    }
    if (s.n_draft > 0) {
      req->num_spec_steps += 1;
      req->num_draft_tokens += s.n_draft;
      req->num_accepted_draft_tokens += accepted;
      totals_.spec_num_drafts_total += 1;
      totals_.spec_draft_tokens_total += s.n_draft;
      totals_.spec_accepted_tokens_total += accepted;
      if (totals_.spec_accepted_per_position.size() < static_cast<size_t>(s.n_draft))
        totals_.spec_accepted_per_position.resize(s.n_draft, 0);
      for (int p = 0; p < accepted; ++p) ++totals_.spec_accepted_per_position[p];
      // The accepted drafts' cache rows are right; the rejected ones' rows lie past the
      // computed length (overwritten later), and their trace in the recurrent state is
      // undone at the start of the next step: the state goes back to where this step began
      // and advances over the accepted tokens only.
      req->num_computed_tokens += accepted;
      if (reason == FinishReason::kNone && accepted < s.n_draft && cache_.verify_slot(req->seq_id) >= 0)
        req->pending_replay = {spec_first_row_[i], s.n_new_tokens - s.n_draft + accepted};
    }

    std::string delta = req->text.take_delta(reason != FinishReason::kNone);
    RequestOutput out;
    if (reason != FinishReason::kNone) {
      out = finish(req, reason, std::move(delta));
    } else {
      out.request_id = req->group_id;
      out.index = req->index;
      out.text_delta = std::move(delta);
      out.num_prompt_tokens = req->num_prompt_tokens();
      out.num_output_tokens = req->num_output_tokens();
      out.num_cached_tokens = req->num_cached_tokens;
    }
    out.new_token_ids = std::move(new_ids);
    out.logprobs = std::move(logprobs);
    out.first_scheduled_time = req->first_scheduled_time;
    out.num_spec_steps = req->num_spec_steps;
    out.num_draft_tokens = req->num_draft_tokens;
    out.num_accepted_draft_tokens = req->num_accepted_draft_tokens;
    outputs.push_back(std::move(out));

    if (req->finished()) {
      auto g = groups_.find(req->group_id);
      auto& seqs = g->second;
      seqs.erase(std::find(seqs.begin(), seqs.end(), req->seq_id));
      if (seqs.empty()) groups_.erase(g);
      requests_.erase(req->seq_id);  // req dangles from here on
    }
  }
}

std::span<const int32_t> Engine::prompt_of(int64_t seq) const {
  auto it = requests_.find(seq);
  return it == requests_.end() ? std::span<const int32_t>() : std::span<const int32_t>(it->second->prompt_ids);
}

// ---- the prefill lane ---------------------------------------------------------------

PrefillLane* Engine::lane() const {
  return config_.prefill_lane_min_tokens > 0 && config_.prefill_lane_chunk_tokens > 0 ? runner_.prefill_lane() : nullptr;
}

Status Engine::start_lane() {
  PrefillLane* lane = this->lane();
  if (!lane || lane_job_) return Status::ok();
  // Between steps no slot command is pending: what the scheduling below queues is the
  // chunk's alone (a newcomer's zeroed or restored slot before it, its snapshot after).
  {
    std::vector<StateCopy> before, after;
    cache_.take_state_copies(before, after);
    if (!before.empty() || !after.empty())
      return internal_error("prefill lane: slot commands of another step were pending (" +
                            std::to_string(before.size() + after.size()) + ")");
  }
  for (Request* r : scheduler_.running()) {
    // A running request with more than the last token to compute, no images (their rows ride
    // in the step): its next chunk. (Admitted by a shared step while the lane was busy, or
    // preempted and back: its first chunk ran there.)
    if (r->in_lane || r->num_prompt_tokens() < config_.prefill_lane_min_tokens || r->num_computed_tokens == 0 ||
        r->num_tokens() - r->num_computed_tokens < 2 || r->has_images())
      continue;
    const ScheduledSeq s = scheduler_.schedule_lane(r, config_.prefill_lane_chunk_tokens);
    if (s.n_new_tokens == 0) continue;  // no pages for it now: the main steps go on
    return submit_lane(s);
  }
  // A newcomer with a long prompt: admitted straight onto the lane, its first chunk too (in a
  // shared step that chunk, unpaced before the pacer has learned, was the streams' longest gap).
  const ScheduledSeq s = scheduler_.admit_to_lane(config_.prefill_lane_chunk_tokens, config_.prefill_lane_min_tokens);
  if (!s.req) return Status::ok();
  s.req->first_scheduled_time = std::chrono::steady_clock::now();
  return submit_lane(s);
}

Status Engine::submit_lane(const ScheduledSeq& s) {
  Request* r = s.req;
  auto job = std::make_unique<LaneJob>();
  job->req = r;
  job->scheduled.seqs.push_back(s);
  job->scheduled.n_tokens = s.n_new_tokens;
  for (int t = 0; t < s.n_new_tokens; ++t) job->tokens.push_back(r->token_at(r->num_computed_tokens + t));
  job->pages = cache_.page_table(r->seq_id);
  StepSeq seq;
  seq.new_token_ids = job->tokens;
  seq.n_past = r->num_computed_tokens;
  seq.state_slot = cache_.state_slot(r->seq_id);
  seq.pages = job->pages;
  seq.sample = s.samples;
  if (s.samples) add_sampling_row(*r, job->input.sampling, 0, r->constraint.get());
  job->input.seqs.push_back(seq);
  // The chunk's own slot commands (start_lane checked nothing else was pending).
  cache_.take_state_copies(job->input.before, job->input.after);
  job->snapshots = cache_.take_planned_snapshots();
  r->in_lane = true;
  runner_.prefill_lane()->submit(&job->input, &job->output);
  lane_job_ = std::move(job);
  return Status::ok();
}

Status Engine::collect_lane(std::vector<RequestOutput>& outputs, std::chrono::microseconds wait) {
  if (!lane_job_) return Status::ok();
  PrefillLane* lane = runner_.prefill_lane();
  if (wait != std::chrono::microseconds::max() && !lane->wait_for(wait)) return Status::ok();
  const Status st = lane->take();
  std::unique_ptr<LaneJob> job = std::move(lane_job_);
  job->req->in_lane = false;
  MR_RETURN_IF_ERROR(st);
  const size_t want = job->scheduled.seqs[0].samples ? 1 : 0;
  if (job->output.samples.size() != want)
    return internal_error("prefill lane: " + std::to_string(job->output.samples.size()) + " tokens for " +
                          std::to_string(want) + " sampling rows");
  cache_.commit_snapshots(std::move(job->snapshots), [this](int64_t seq) { return prompt_of(seq); });
  postprocess(job->scheduled, job->output, outputs);
  return Status::ok();
}

double Engine::now_seconds() const {
  if (config_.clock) return config_.clock();
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

Status Engine::step(std::vector<RequestOutput>& outputs) {
  MR_RETURN_IF_ERROR(lane_failure_);
  // The prefill lane's chunk, if done, then its next one: before this step's schedule, so
  // the lane's request is out of it.
  MR_RETURN_IF_ERROR(collect_lane(outputs, std::chrono::microseconds(0)));
  MR_RETURN_IF_ERROR(start_lane());
  if (lane_job_ && config_.prefill_lane_step_ms > 0) {
    // While the lane works, steps start at most every prefill_lane_step_ms: decode steps,
    // which would otherwise run back to back at the higher priority, leave the lane's chunk
    // the rest of the device (the long prompt's time against the others' gaps).
    const double interval = config_.prefill_lane_step_ms / 1e3, since = now_seconds() - last_step_start_;
    if (since < interval)
      MR_RETURN_IF_ERROR(
          collect_lane(outputs, std::chrono::microseconds(static_cast<int64_t>((interval - since) * 1e6))));
    MR_RETURN_IF_ERROR(start_lane());
  }
  last_step_start_ = now_seconds();
  const bool paced = config_.max_prefill_step_ms > 0;
  const double t0 = config_.auto_stand_aside || paced ? now_seconds() : 0;
  step_speculates_ = false;
  step_decoding_ = 0;
  // MOONRUN_DEBUG_STEP_PHASES=1: where a step's host time goes (speculation adds drafting and
  // k + 1 rows to check); the runner and the draft split theirs further.
  static DebugPhases phases("engine step", {"drafts", "schedule+inputs", "runner", "postprocess"});
  phases.start();
  MR_RETURN_IF_ERROR(propose_drafts());
  phases.mark(0);
  if (paced && pacer_.ready()) scheduler_.set_prefill_budget(pacer_.budget(config_.max_prefill_step_ms / 1e3));
  const SchedulerOutput scheduled = schedule();
  if (scheduled.empty() && lane_job_) {
    // Only the lane has work: wait for it a little (new requests are let in between).
    return collect_lane(outputs, std::chrono::milliseconds(5));
  }
  if (scheduled.empty()) {
    // Work is waiting but nothing could be scheduled: with max_model_len <= pool size and an
    // empty running set this cannot happen, so it is a bug, not a wait.
    if (has_work() && scheduler_.num_running() == 0 && scheduled.preempted.empty())
      return internal_error("scheduler made no progress with " + std::to_string(scheduler_.num_waiting()) +
                            " waiting requests and an idle cache");
    return Status::ok();
  }
  // The step's prefill attention (what the pacer learns a pair's cost from).
  int64_t prefill_pairs = 0, prefill_context = 0;
  for (const ScheduledSeq& s : paced ? std::span<const ScheduledSeq>(scheduled.seqs) : std::span<const ScheduledSeq>())
    if (s.n_draft == 0 && s.n_new_tokens > 1) {
      prefill_pairs += Scheduler::attention_pairs(s.req->num_computed_tokens, s.n_new_tokens);
      prefill_context += s.req->num_computed_tokens;
    }
  StepInput input;
  prepare_inputs(scheduled, input);
  phases.mark(1);
  StepOutput result;
  MR_RETURN_IF_ERROR(forward(input, result));
  phases.mark(2);
  if (paced) pacer_.record(scheduled.n_tokens, prefill_pairs, prefill_context, now_seconds() - t0);
  // The snapshots taken after this forward become cached prefixes of their prompts.
  cache_.commit_snapshots([this](int64_t seq) { return prompt_of(seq); });
  const int64_t generated_before = totals_.generation_tokens_total;
  postprocess(scheduled, result, outputs);
  phases.mark(3);
  phases.done(!has_work());
  ++totals_.steps_total;
  if (config_.auto_stand_aside && (drafts_ || config_.speculative.method == SpecMethod::kDSpark)) {
    // Only pure decode steps of the batch the verdict was for measure the two kinds.
    bool pure = static_cast<int>(scheduled.seqs.size()) == step_decoding_ && scheduled.preempted.empty();
    for (const ScheduledSeq& s : scheduled.seqs) pure = pure && s.samples && s.n_new_tokens - s.n_draft == 1;
    if (pure)
      balance_.record(step_decoding_, step_speculates_, totals_.generation_tokens_total - generated_before,
                      now_seconds() - t0);
  }
  return Status::ok();
}

EngineStats Engine::stats() const {
  EngineStats s = totals_;
  s.num_running = scheduler_.num_running();
  s.num_waiting = scheduler_.num_waiting();
  s.cache = cache_.stats();
  s.preemptions_total = scheduler_.num_preemptions();
  return s;
}

}  // namespace moonrun
