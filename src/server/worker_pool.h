#pragma once
// The threads that answer requests: a request's handler may block for a whole generation
// (waiting on the engine) and then write a long stream, so each in-flight request holds one
// thread, and the pool grows on demand up to a cap (--http-threads; by default enough for
// every request the engine can run or queue). Threads idle for a while exit. When every
// thread is busy, try_submit() refuses and the server answers 503 with Retry-After at once:
// no hidden second queue in front of the engine's.
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace moonrun::server {

class WorkerPool {
 public:
  explicit WorkerPool(size_t max_threads);
  ~WorkerPool();  // waits for every task to finish

  bool try_submit(std::function<void()> task);
  size_t busy() const;
  size_t max_threads() const { return max_threads_; }

 private:
  void worker();
  const size_t max_threads_;
  mutable std::mutex mu_;
  std::condition_variable cv_, exited_cv_;
  std::deque<std::function<void()>> tasks_;
  size_t threads_ = 0, idle_ = 0;
  bool stopping_ = false;
};

}  // namespace moonrun::server
