#include "server/generation.h"

#include <algorithm>

#include "common/log.h"

namespace moonrun::server {

namespace {
thread_local RequestRecord* t_current = nullptr;
double seconds_between(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}
}  // namespace

RequestRecord* current_request() { return t_current; }
ScopedCurrentRequest::ScopedCurrentRequest(RequestRecord* record) : previous_(t_current) { t_current = record; }
ScopedCurrentRequest::~ScopedCurrentRequest() { t_current = previous_; }

void RequestRecord::cut_all() {
  std::lock_guard<std::mutex> lock(mu);
  cut = true;
  for (Generation* g : live) g->cut();
}

Status shutdown_cut_status() {
  return unavailable("The server is shutting down: this request was still running when --shutdown-timeout passed, "
                     "so it was cut. Retry it on another replica or after the restart.");
}

Result<std::unique_ptr<Generation>> Generation::start(EngineLoop& engine, Metrics& metrics,
                                                      std::vector<int32_t> prompt_ids,
                                                      const SamplingParams& params,
                                                      std::shared_ptr<const vision::PromptImages> images) {
  auto g = std::unique_ptr<Generation>(new Generation());
  g->engine_ = &engine;
  g->metrics_ = &metrics;
  g->n_ = params.n;
  g->usage_.prompt_tokens = static_cast<int>(prompt_ids.size());
  g->usage_.image_tokens = images ? images->num_tokens() : 0;
  g->start_ = std::chrono::steady_clock::now();
  auto stream = engine.submit(std::move(prompt_ids), params, std::move(images));
  if (!stream.is_ok()) return stream.status();
  g->stream_ = std::move(stream).value();
  if (RequestRecord* rec = current_request()) {
    g->record_ = rec;
    std::lock_guard<std::mutex> lock(rec->mu);
    rec->live.push_back(g.get());
    rec->prompt_tokens = std::max(rec->prompt_tokens, 0) + g->usage_.prompt_tokens;
    if (rec->cut) g->cut();
  }
  return g;
}

Generation::~Generation() {
  if (stream_ && !stream_->done()) engine_->abort(stream_->id());
  if (record_) {
    std::lock_guard<std::mutex> lock(record_->mu);
    auto& live = record_->live;
    live.erase(std::remove(live.begin(), live.end(), this), live.end());
  }
}

void Generation::abort() {
  if (stream_ && !stream_->done()) engine_->abort(stream_->id());
}

void Generation::cut() {
  cut_ = true;
  if (stream_) engine_->abort(stream_->id());
}

void Generation::account(const RequestOutput& out) {
  auto now = std::chrono::steady_clock::now();
  if (out.first_scheduled_time != std::chrono::steady_clock::time_point{} &&
      (first_scheduled_ == std::chrono::steady_clock::time_point{} || out.first_scheduled_time < first_scheduled_))
    first_scheduled_ = out.first_scheduled_time;
  if (!out.new_token_ids.empty()) {
    if (!first_token_seen_) {
      first_token_seen_ = true;
      first_token_ = now;
      const double ttft = seconds_between(start_, now);
      metrics_->ttft_seconds().observe(ttft);
      if (record_) {
        std::lock_guard<std::mutex> lock(record_->mu);
        record_->ttft_s = ttft;
      }
    } else {
      metrics_->itl_seconds().observe(seconds_between(last_token_, now));
    }
    last_token_ = now;
  }
  usage_.prompt_tokens = std::max(usage_.prompt_tokens, out.num_prompt_tokens);
  usage_.cached_tokens = std::max(usage_.cached_tokens, out.num_cached_tokens);
  if (out.finished) {
    usage_.completion_tokens += out.num_output_tokens;
    if (record_ && out.num_spec_steps > 0) {
      std::lock_guard<std::mutex> lock(record_->mu);
      record_->spec_steps += out.num_spec_steps;
      record_->spec_draft_tokens += out.num_draft_tokens;
      record_->spec_accepted_tokens += out.num_accepted_draft_tokens;
    }
    metrics_->request_finished(finish_reason_name(out.finish_reason));
  }
  if (stream_->done() && !finished_all_) {
    finished_all_ = true;
    // vLLM's request phases: queued (arrival to first scheduled), prefill (to the first
    // token), decode (first to last token); inference = prefill + decode.
    RequestTimes t;
    t.e2e_s = seconds_between(start_, now);
    if (first_scheduled_ != std::chrono::steady_clock::time_point{}) {
      t.queue_s = std::max(0.0, seconds_between(start_, first_scheduled_));
      if (first_token_seen_) {
        t.prefill_s = std::max(0.0, seconds_between(first_scheduled_, first_token_));
        t.decode_s = std::max(0.0, seconds_between(first_token_, last_token_));
      }
    }
    t.prompt_tokens = usage_.prompt_tokens;
    t.generation_tokens = usage_.completion_tokens;
    metrics_->request_done(t);
    if (record_) {
      std::lock_guard<std::mutex> lock(record_->mu);
      record_->completion_tokens = std::max(record_->completion_tokens, 0) + usage_.completion_tokens;
      if (t.queue_s >= 0) record_->queue_s = t.queue_s;
    }
  }
}

bool Generation::next(RequestOutput& out, std::chrono::milliseconds timeout) {
  if (!stream_->next(out, timeout)) return false;
  account(out);
  return true;
}

Result<std::vector<SampleOutcome>> Generation::collect(const std::function<bool()>& client_gone) {
  std::vector<SampleOutcome> samples(n_);
  RequestOutput out;
  // With a liveness check, wait in short slices so a dead client is noticed within
  // kClientCheckInterval; the check itself runs at most that often, however fast tokens come.
  const auto wait = client_gone ? kClientCheckInterval : std::chrono::milliseconds(200);
  auto last_check = std::chrono::steady_clock::now();
  while (!stream_->done()) {
    const bool got = next(out, wait);
    if (client_gone && !client_gone_seen_) {
      const auto now = std::chrono::steady_clock::now();
      if (now - last_check >= kClientCheckInterval) {
        last_check = now;
        if (client_gone()) {
          client_gone_seen_ = true;
          MR_LOG(DEBUG) << "client disconnected; aborting request " << stream_->id();
          abort();  // the stream still ends (kAbort): keep taking outputs so it is accounted
        }
      }
    }
    if (!got) continue;
    if (out.index < 0 || out.index >= n_) continue;
    SampleOutcome& s = samples[out.index];
    s.token_ids.insert(s.token_ids.end(), out.new_token_ids.begin(), out.new_token_ids.end());
    if (!out.text_delta.empty() || !out.new_token_ids.empty()) {
      s.text_pieces.push_back(std::move(out.text_delta));
      s.piece_tokens.push_back(static_cast<int>(out.new_token_ids.size()));
      s.text += s.text_pieces.back();
    }
    s.logprobs.insert(s.logprobs.end(), std::make_move_iterator(out.logprobs.begin()),
                      std::make_move_iterator(out.logprobs.end()));
    if (out.finished) {
      if (!out.error.is_ok()) return out.error;
      s.finish_reason = out.finish_reason;
      s.stop_reason = out.stop_reason;
    }
  }
  if (cut_) return shutdown_cut_status();
  if (client_gone_seen_) return unavailable("the client disconnected; its request was aborted");
  return samples;
}

}  // namespace moonrun::server
