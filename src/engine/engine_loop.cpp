#include "engine/engine_loop.h"

#include <algorithm>
#include <exception>
#include <string>

#include "common/log.h"

namespace moonrun {

// ---- RequestStream -------------------------------------------------------------------

bool RequestStream::next(RequestOutput& out, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!cv_.wait_for(lock, timeout, [&] { return !queue_.empty(); })) return false;
  out = std::move(queue_.front());
  queue_.pop_front();
  return true;
}

bool RequestStream::done() const {
  std::lock_guard<std::mutex> lock(mu_);
  return remaining_ == 0 && queue_.empty();
}

bool RequestStream::all_finished() const {
  std::lock_guard<std::mutex> lock(mu_);
  return remaining_ == 0;
}

void RequestStream::push(RequestOutput out) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (out.finished && remaining_ > 0) --remaining_;
    queue_.push_back(std::move(out));
  }
  cv_.notify_all();
}

// ---- EngineLoop ----------------------------------------------------------------------

Result<std::unique_ptr<EngineLoop>> EngineLoop::create(const EngineConfig& config,
                                                       std::unique_ptr<CacheManager> cache,
                                                       std::unique_ptr<StepRunner> runner,
                                                       DetokenizeFn detokenize) {
  if (!cache || !runner) return invalid_argument("EngineLoop needs a cache manager and a model runner");
  MR_RETURN_IF_ERROR(check_engine_config(config, cache->config()));
  std::unique_ptr<EngineLoop> loop(new EngineLoop());
  loop->cache_ = std::move(cache);
  loop->runner_ = std::move(runner);
  loop->engine_ = std::make_unique<Engine>(config, *loop->cache_, *loop->runner_, std::move(detokenize));
  loop->stats_ = loop->engine_->stats();
  return loop;
}

EngineLoop::~EngineLoop() { stop(); }

Status EngineLoop::start() {
  if (thread_.joinable()) return failed_precondition("the engine loop is already running");
  alive_ = true;
  thread_ = std::thread([this] { run(); });
  return Status::ok();
}

void EngineLoop::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_requested_ = true;
  }
  accepting_ = false;
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  alive_ = false;
}

Result<std::shared_ptr<RequestStream>> EngineLoop::submit(std::vector<int32_t> prompt_ids,
                                                          const SamplingParams& params,
                                                          std::shared_ptr<const vision::PromptImages> images) {
  // Validation reads only the fixed configuration: safe off the loop thread, and the caller
  // gets the 400 at once.
  MR_RETURN_IF_ERROR(engine_->validate(prompt_ids, params));
  // Checked under the lock that die() and the stopping loop take to sweep the streams, so
  // a request is either swept (and ended) or refused here: never left hanging.
  std::lock_guard<std::mutex> lock(mu_);
  if (!alive_ || stop_requested_) return unavailable("the engine is not running");
  if (!accepting_) return unavailable("the server is shutting down");
  const int max_queued = engine_->config().scheduler.max_queued_requests;
  int inbox_seqs = 0;
  for (const Submission& s : inbox_) inbox_seqs += s.params.n;
  if (max_queued >= 0 && stats_.num_waiting + inbox_seqs + deferred_seqs_ + params.n > max_queued) {
    return resource_exhausted("the waiting queue is full (--max-queued-requests " + std::to_string(max_queued) +
                              "); retry later");
  }
  const uint64_t id = next_id_++;
  auto stream = std::make_shared<RequestStream>(id, params.n);
  streams_.emplace(id, stream);
  inbox_.push_back({id, std::move(prompt_ids), params, std::move(images)});
  cv_.notify_all();
  return stream;
}

void EngineLoop::abort(uint64_t request_id) {
  std::lock_guard<std::mutex> lock(mu_);
  aborts_.push_back(request_id);
  cv_.notify_all();
}

EngineStats EngineLoop::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void EngineLoop::deliver(std::vector<RequestOutput>& outputs) {
  // Stats first, under the same lock: a client that sees its request finish also sees its
  // cache freed in stats().
  const EngineStats snapshot = engine_->stats();
  std::lock_guard<std::mutex> lock(mu_);
  stats_ = snapshot;
  for (RequestOutput& out : outputs) {
    auto it = streams_.find(out.request_id);
    if (it == streams_.end()) continue;
    std::shared_ptr<RequestStream> stream = it->second;
    stream->push(std::move(out));
    if (stream->all_finished()) streams_.erase(it);
  }
  outputs.clear();
}

void EngineLoop::die(const Status& error) {
  MR_LOG(ERROR) << "engine failed: " << error.message() << "; failing every pending request";
  alive_ = false;
  accepting_ = false;
  std::vector<RequestOutput> outputs;
  engine_->fail_all(error, outputs);
  deliver(outputs);
  // Requests that never reached the engine, and any stream left over.
  std::lock_guard<std::mutex> lock(mu_);
  alive_ = false;
  inbox_.clear();
  for (auto& [id, stream] : streams_) {
    while (!stream->all_finished()) {
      RequestOutput out;
      out.request_id = id;
      out.finished = true;
      out.finish_reason = FinishReason::kError;
      out.error = error;
      stream->push(std::move(out));
    }
  }
  streams_.clear();
  stats_ = engine_->stats();
}

void EngineLoop::run() {
  std::vector<RequestOutput> outputs;
  try {
    while (true) {
      std::deque<Submission> inbox;
      std::vector<uint64_t> aborts;
      bool stopping = false;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] {
          return stop_requested_ || !inbox_.empty() || !aborts_.empty() || engine_->has_work() ||
                 !deferred_.empty();
        });
        inbox.swap(inbox_);
        aborts.swap(aborts_);
        stopping = stop_requested_;
      }
      // Deferred ones first: they were admitted earlier.
      while (!deferred_.empty()) {
        inbox.push_front(std::move(deferred_.back()));
        deferred_.pop_back();
      }
      int deferred_seqs = 0;
      for (Submission& s : inbox) {
        if (std::find(aborts.begin(), aborts.end(), s.id) != aborts.end() || stopping) {
          for (int i = 0; i < s.params.n; ++i) {
            RequestOutput out;
            out.request_id = s.id;
            out.index = i;
            out.finished = true;
            out.finish_reason = FinishReason::kAbort;
            outputs.push_back(std::move(out));
          }
          continue;
        }
        const Status st = engine_->add_request(s.id, s.prompt_ids, s.params, s.images);
        if (st.code() == StatusCode::kResourceExhausted) {
          deferred_seqs += s.params.n;
          deferred_.push_back(std::move(s));
          continue;
        }
        if (!st.is_ok()) {
          for (int i = 0; i < s.params.n; ++i) {
            RequestOutput out;
            out.request_id = s.id;
            out.index = i;
            out.finished = true;
            out.finish_reason = FinishReason::kError;
            out.error = st;
            outputs.push_back(std::move(out));
          }
        }
      }
      {
        std::lock_guard<std::mutex> lock(mu_);
        deferred_seqs_ = deferred_seqs;
      }
      for (uint64_t id : aborts) engine_->abort_request(id, outputs);
      if (stopping) {
        // Whatever is left ends as aborted: stop() is the last word (drain waits before it).
        std::vector<uint64_t> ids;
        {
          std::lock_guard<std::mutex> lock(mu_);
          for (const auto& [id, stream] : streams_) ids.push_back(id);
        }
        for (uint64_t id : ids) engine_->abort_request(id, outputs);
        deliver(outputs);
        return;
      }
      if (engine_->has_work()) {
        const Status st = engine_->step(outputs);
        if (!st.is_ok()) {
          deliver(outputs);
          die(st);
          return;
        }
      }
      deliver(outputs);
    }
  } catch (const std::exception& e) {
    deliver(outputs);
    die(internal_error(std::string("engine loop: ") + e.what()));
  } catch (...) {
    deliver(outputs);
    die(internal_error("engine loop: unknown exception"));
  }
}

}  // namespace moonrun
