#include "server/worker_pool.h"

#include <chrono>

namespace moonrun::server {

namespace {
constexpr auto kIdleExit = std::chrono::seconds(30);
}

WorkerPool::WorkerPool(size_t max_threads) : max_threads_(std::max<size_t>(1, max_threads)) {}

WorkerPool::~WorkerPool() {
  std::unique_lock<std::mutex> lock(mu_);
  stopping_ = true;
  cv_.notify_all();
  exited_cv_.wait(lock, [&] { return threads_ == 0; });
}

size_t WorkerPool::busy() const {
  std::lock_guard<std::mutex> lock(mu_);
  return threads_ - idle_ + tasks_.size();
}

bool WorkerPool::try_submit(std::function<void()> task) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stopping_) return false;
  if (idle_ > tasks_.size()) {
    tasks_.push_back(std::move(task));
    cv_.notify_one();
    return true;
  }
  if (threads_ >= max_threads_) return false;
  tasks_.push_back(std::move(task));
  ++threads_;
  std::thread([this] { worker(); }).detach();  // joined through exited_cv_ in the destructor
  return true;
}

void WorkerPool::worker() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    if (tasks_.empty()) {
      ++idle_;
      const bool got = cv_.wait_for(lock, kIdleExit, [&] { return stopping_ || !tasks_.empty(); });
      --idle_;
      if (!got || (stopping_ && tasks_.empty())) break;
    }
    auto task = std::move(tasks_.front());
    tasks_.pop_front();
    lock.unlock();
    task();
    task = nullptr;  // its captures (connections, responses) die on this thread, unlocked
    lock.lock();
  }
  --threads_;
  exited_cv_.notify_all();
}

}  // namespace moonrun::server
