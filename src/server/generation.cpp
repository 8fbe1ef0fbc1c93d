#include "server/generation.h"

#include "common/log.h"

namespace moonrun::server {

Result<std::unique_ptr<Generation>> Generation::start(EngineLoop& engine, Metrics& metrics,
                                                      std::vector<int32_t> prompt_ids,
                                                      const SamplingParams& params) {
  auto g = std::unique_ptr<Generation>(new Generation());
  g->engine_ = &engine;
  g->metrics_ = &metrics;
  g->n_ = params.n;
  g->usage_.prompt_tokens = static_cast<int>(prompt_ids.size());
  g->start_ = std::chrono::steady_clock::now();
  auto stream = engine.submit(std::move(prompt_ids), params);
  if (!stream.is_ok()) return stream.status();
  g->stream_ = std::move(stream).value();
  return g;
}

Generation::~Generation() {
  if (stream_ && !stream_->done()) engine_->abort(stream_->id());
}

void Generation::abort() {
  if (stream_ && !stream_->done()) engine_->abort(stream_->id());
}

void Generation::account(const RequestOutput& out) {
  auto now = std::chrono::steady_clock::now();
  if (!out.new_token_ids.empty()) {
    if (!first_token_seen_) {
      first_token_seen_ = true;
      metrics_->ttft_seconds().observe(std::chrono::duration<double>(now - start_).count());
    } else {
      metrics_->itl_seconds().observe(std::chrono::duration<double>(now - last_token_).count());
    }
    last_token_ = now;
  }
  usage_.prompt_tokens = std::max(usage_.prompt_tokens, out.num_prompt_tokens);
  usage_.cached_tokens = std::max(usage_.cached_tokens, out.num_cached_tokens);
  if (out.finished) {
    usage_.completion_tokens += out.num_output_tokens;
    metrics_->request_finished(finish_reason_name(out.finish_reason));
  }
  if (stream_->done() && !finished_all_) {
    finished_all_ = true;
    metrics_->e2e_seconds().observe(std::chrono::duration<double>(now - start_).count());
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
          MR_LOG(INFO) << "client disconnected; aborting request " << stream_->id();
          abort();  // the stream still ends (kAbort): keep taking outputs so it is accounted
        }
      }
    }
    if (!got) continue;
    if (out.index < 0 || out.index >= n_) continue;
    SampleOutcome& s = samples[out.index];
    s.token_ids.insert(s.token_ids.end(), out.new_token_ids.begin(), out.new_token_ids.end());
    if (!out.text_delta.empty() || !out.new_token_ids.empty()) {
      s.text_pieces.push_back(out.text_delta);
      s.piece_tokens.push_back(static_cast<int>(out.new_token_ids.size()));
      s.text += out.text_delta;
    }
    s.logprobs.insert(s.logprobs.end(), out.logprobs.begin(), out.logprobs.end());
    if (out.finished) {
      if (!out.error.is_ok()) return out.error;
      s.finish_reason = out.finish_reason;
      s.stop_reason = out.stop_reason;
    }
  }
  if (client_gone_seen_) return unavailable("the client disconnected; its request was aborted");
  return samples;
}

}  // namespace moonrun::server
