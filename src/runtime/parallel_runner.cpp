#include "runtime/parallel_runner.h"

#include <algorithm>
#include <string>

namespace moonrun {

Result<std::unique_ptr<ParallelRunner>> ParallelRunner::create(std::vector<std::unique_ptr<ModelRunner>> ranks) {
  if (ranks.empty()) return invalid_argument("ParallelRunner: no ranks");
  std::unique_ptr<ParallelRunner> p(new ParallelRunner());
  p->ranks_ = std::move(ranks);
  const size_t n = p->ranks_.size();
  p->outputs_.resize(n);
  p->statuses_.assign(n, Status::ok());
  for (size_t r = 0; r < n; ++r) p->threads_.emplace_back([raw = p.get(), r] { raw->work(static_cast<int>(r)); });
  return p;
}

ParallelRunner::~ParallelRunner() {
  lane_.reset();  // its runners read the ranks' weights and pools
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  start_cv_.notify_all();
  for (auto& t : threads_) t.join();
}

Status ParallelRunner::enable_prefill_lane(int chunk_tokens, std::vector<std::unique_ptr<Communicator>> comms) {
  if (lane_) return Status::ok();
  if (comms.size() != ranks_.size())
    return invalid_argument("a group's prefill lane needs a communicator a rank: " + std::to_string(comms.size()) +
                            " for " + std::to_string(ranks_.size()));
  std::vector<std::unique_ptr<ModelRunner>> lanes;
  for (size_t r = 0; r < ranks_.size(); ++r) {
    ranks_[r]->bind_thread();  // the lane's scratch comes from this rank's device
    lanes.push_back(MR_TRY(ranks_[r]->make_lane_runner(chunk_tokens, std::move(comms[r]))));
  }
  lane_ = std::make_unique<PrefillLane>(MR_TRY(ParallelRunner::create(std::move(lanes))));
  return Status::ok();
}

int64_t ParallelRunner::free_bytes() const {
  int64_t least = INT64_MAX;
  for (const auto& r : ranks_) least = std::min(least, r->free_bytes());
  return least;
}

void ParallelRunner::work(int r) {
  uint64_t seen = 0;
  while (true) {
    const StepInput* input = nullptr;
    {
      std::unique_lock<std::mutex> lock(mu_);
      start_cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      input = input_;
    }
    Status st = Status::ok();
    try {
      ranks_[static_cast<size_t>(r)]->ops().bind_thread();  // this rank's GPU on this thread
    } catch (const BackendError& e) {
      st = internal_error(std::string("rank ") + std::to_string(r) + ": " + e.what());
    }
    if (st.is_ok()) st = ranks_[static_cast<size_t>(r)]->step(*input, outputs_[static_cast<size_t>(r)]);
    std::lock_guard<std::mutex> lock(mu_);
    statuses_[static_cast<size_t>(r)] = std::move(st);
    if (--pending_ == 0) done_cv_.notify_all();
  }
}

Status ParallelRunner::step(const StepInput& input, StepOutput& output) {
  std::unique_lock<std::mutex> lock(mu_);
  input_ = &input;
  pending_ = static_cast<int>(ranks_.size());
  ++generation_;
  start_cv_.notify_all();
  done_cv_.wait(lock, [&] { return pending_ == 0; });
  input_ = nullptr;
  // The failure to report is the one that started it, not the peers it woke.
  const Status* first = nullptr;
  for (const Status& st : statuses_) {
    if (st.is_ok()) continue;
    const bool follow_on = st.message().find("the parallel group was aborted") != std::string::npos;
    if (!first || (!follow_on && first->message().find("the parallel group was aborted") != std::string::npos))
      first = &st;
  }
  if (first) return *first;
  output = std::move(outputs_[0]);
  return Status::ok();
}

}  // namespace moonrun
