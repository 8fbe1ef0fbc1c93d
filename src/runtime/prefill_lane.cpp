#include "runtime/prefill_lane.h"

#include <exception>
#include <string>

#include "common/log.h"
#include "runtime/model_runner.h"

namespace moonrun {

PrefillLane::PrefillLane(std::unique_ptr<StepRunner> runner) : runner_(std::move(runner)) {
  MR_CHECK(runner_) << "a prefill lane needs a runner";
  thread_ = std::thread([this] { run(); });
}

PrefillLane::~PrefillLane() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();  // after the step in flight, if any
}

void PrefillLane::submit(const StepInput* input, StepOutput* output) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    MR_CHECK(!submitted_) << "PrefillLane::submit while a step is in flight";
    input_ = input;
    output_ = output;
    submitted_ = true;
    finished_ = false;
  }
  cv_.notify_all();
}

bool PrefillLane::busy() const {
  std::lock_guard<std::mutex> lock(mu_);
  return submitted_;
}

bool PrefillLane::wait_for(std::chrono::microseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, timeout, [&] { return !submitted_ || finished_; });
}

Status PrefillLane::take() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return !submitted_ || finished_; });
  submitted_ = false;
  finished_ = false;
  input_ = nullptr;
  output_ = nullptr;
  return status_;
}

void PrefillLane::run() {
  runner_->bind_thread();
  while (true) {
    const StepInput* input = nullptr;
    StepOutput* output = nullptr;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || (submitted_ && !finished_); });
      if (submitted_ && !finished_) {
        input = input_;
        output = output_;
      } else {
        return;  // stopping with nothing in flight
      }
    }
    Status st = Status::ok();
    try {
      st = runner_->step(*input, *output);
    } catch (const std::exception& e) {
      st = internal_error(std::string("prefill lane: ") + e.what());
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      status_ = st;
      finished_ = true;
    }
    cv_.notify_all();
  }
}

}  // namespace moonrun
