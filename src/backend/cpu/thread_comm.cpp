#include "backend/cpu/thread_comm.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "backend/ops.h"

namespace moonrun::cpu {

class ThreadGroup {
 public:
  explicit ThreadGroup(int size) : size_(size), ptrs_(static_cast<size_t>(size)) {}

  // Returns once every rank arrived; throws BackendError when the group is aborted first.
  void barrier() {
    std::unique_lock<std::mutex> lock(mu_);
    if (aborted_) throw BackendError(why_);
    const uint64_t gen = generation_;
    if (++arrived_ == size_) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
      return;
    }
    cv_.wait(lock, [&] { return generation_ != gen || aborted_; });
    if (generation_ == gen) throw BackendError(why_);
  }

  void abort(const std::string& why) {
    std::lock_guard<std::mutex> lock(mu_);
    if (aborted_) return;
    aborted_ = true;
    why_ = "the parallel group was aborted: " + why;
    cv_.notify_all();
  }

  int size() const { return size_; }
  const void*& ptr(int rank) { return ptrs_[static_cast<size_t>(rank)]; }

 private:
  const int size_;
  std::vector<const void*> ptrs_;  // each rank's buffer for the collective in progress
  std::mutex mu_;
  std::condition_variable cv_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
  bool aborted_ = false;
  std::string why_;
};

namespace {

class ThreadComm final : public Communicator {
 public:
  ThreadComm(std::shared_ptr<ThreadGroup> group, int rank) : group_(std::move(group)), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return group_->size(); }

  void all_reduce_sum(float* data, size_t n) override {
    const int W = group_->size();
    if (W == 1) return;
    group_->ptr(rank_) = data;
    group_->barrier();  // every rank's buffer is published
    // Every rank sums all buffers in rank order (the same bits everywhere) into its own
    // temporary; nobody writes a buffer until every rank has read them all.
    sum_.resize(n);
    std::memcpy(sum_.data(), group_->ptr(0), n * sizeof(float));
    for (int r = 1; r < W; ++r) {
      const float* p = static_cast<const float*>(group_->ptr(r));
      for (size_t i = 0; i < n; ++i) sum_[i] += p[i];
    }
    group_->barrier();  // all reads done
    std::memcpy(data, sum_.data(), n * sizeof(float));
  }

  void all_gather(const float* in, size_t n, float* out) override {
    const int W = group_->size();
    group_->ptr(rank_) = in;
    group_->barrier();
    for (int r = 0; r < W; ++r)
      std::memcpy(out + static_cast<size_t>(r) * n, group_->ptr(r), n * sizeof(float));
    group_->barrier();  // nobody changes its `in` before every rank has copied it
  }

  void broadcast(float* data, size_t n, int root) override {
    if (group_->size() == 1) return;
    group_->ptr(rank_) = data;
    group_->barrier();
    if (rank_ != root) std::memcpy(data, group_->ptr(root), n * sizeof(float));
    group_->barrier();  // the root keeps its buffer until every rank has copied it
  }

  void abort(const std::string& why) override { group_->abort(why); }

 private:
  std::shared_ptr<ThreadGroup> group_;
  int rank_;
  std::vector<float> sum_;
};

}  // namespace

std::vector<std::unique_ptr<Communicator>> make_thread_group(int size) {
  auto group = std::make_shared<ThreadGroup>(size);
  std::vector<std::unique_ptr<Communicator>> out;
  for (int r = 0; r < size; ++r) out.push_back(std::make_unique<ThreadComm>(group, r));
  return out;
}

}  // namespace moonrun::cpu
