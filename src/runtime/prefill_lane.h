#pragma once
// A second lane for long prefill chunks (issue #47): a runner over the same weights and cache
// pools whose steps run on a thread (and, on a GPU, a stream) of their own, beside the engine's
// steps.
//
// Why: a chunk late in a 1M-token prompt attends over ~1M cached rows, ~1 s of one GPU. In the
// one flat batch, every other stream's decode waits for it; cut into small chunks (fair
// chunking) each chunk still pays for expanding the whole cached prefix, so the prompt crawls.
// On a lane the chunk keeps its full size and the decode steps go on beside it: they read
// weights and rows (bandwidth) while the chunk multiplies (tensor cores), and their stream has
// the higher priority, so their blocks take the multiprocessors as the chunk's blocks retire.
//
// What keeps the two lanes apart (the engine's side, engine.cpp): a sequence on the lane is
// skipped by the scheduler and never preempted; its pages are allocated before its chunk is
// submitted and freed only after the chunk is done (an abort waits for it); only the engine's
// thread touches the cache manager. The lane's chunk writes its own sequence's pages and state
// slot, and reads weights and shared prefix pages, which nobody writes.
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>

#include "common/status.h"

namespace moonrun {

class StepRunner;
struct StepInput;
struct StepOutput;

class PrefillLane {
 public:
  // runner: the lane's own (ModelRunner::enable_prefill_lane makes it), bound to this lane's
  // thread before its first step.
  explicit PrefillLane(std::unique_ptr<StepRunner> runner);
  ~PrefillLane();  // waits for a step in flight
  PrefillLane(const PrefillLane&) = delete;
  PrefillLane& operator=(const PrefillLane&) = delete;

  // Starts one step on the lane's thread. The caller keeps input and output alive and
  // untouched until take() (the lane must be idle: nothing submitted and not taken).
  void submit(const StepInput* input, StepOutput* output);
  bool busy() const;  // submitted and not taken
  // Waits up to `timeout` for the submitted step to finish; true when it has (or none is in
  // flight).
  bool wait_for(std::chrono::microseconds timeout);
  // The finished step's status; the lane is idle after. Waits when it has not finished.
  Status take();
  StepRunner& runner() { return *runner_; }

 private:
  void run();

  std::unique_ptr<StepRunner> runner_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  const StepInput* input_ = nullptr;
  StepOutput* output_ = nullptr;
  bool submitted_ = false, finished_ = false, stop_ = false;
  Status status_ = Status::ok();
  std::thread thread_;
};

}  // namespace moonrun
