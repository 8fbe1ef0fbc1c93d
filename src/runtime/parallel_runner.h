#pragma once
// A tensor/expert-parallel group of ranks behind the one StepRunner the engine sees: each
// rank is a ModelRunner (its own backend, its shard of the weights, its caches) on a thread
// of its own; a step runs on every rank at once (their collectives meet inside the
// forward), and rank 0's tokens are the step's answer. The scheduler and the cache
// manager's bookkeeping stay single: every rank gets the same StepInput, so the slot and
// page ids mean the same thing in every rank's pools.
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "runtime/model_runner.h"
#include "runtime/prefill_lane.h"

namespace moonrun {

class ParallelRunner final : public StepRunner {
 public:
  // ranks[r] is rank r's runner (RunnerOptions::rank = r), built over one communicator group.
  static Result<std::unique_ptr<ParallelRunner>> create(std::vector<std::unique_ptr<ModelRunner>> ranks);
  ~ParallelRunner() override;

  Status step(const StepInput& input, StepOutput& output) override;
  int vocab() const override { return ranks_[0]->vocab(); }
  RunnerStats stats() const override { return ranks_[0]->stats(); }
  int64_t free_bytes() const override;
  bool set_op_profile(OpProfile* profile) override { return ranks_[0]->set_op_profile(profile); }
  int size() const { return static_cast<int>(ranks_.size()); }
  ModelRunner& rank(int r) { return *ranks_[static_cast<size_t>(r)]; }
  // The prefill lane of a group (runtime/prefill_lane.h): every rank's lane runner
  // (ModelRunner::make_lane_runner over its member of `comms`, a second group of the same
  // size for the lanes' collectives) behind one ParallelRunner on the lane's thread, so a
  // chunk runs on every rank at once as a step does.
  Status enable_prefill_lane(int chunk_tokens, std::vector<std::unique_ptr<Communicator>> comms);
  PrefillLane* prefill_lane() override { return lane_.get(); }

 private:
  ParallelRunner() = default;
  void work(int r);

  std::vector<std::unique_ptr<ModelRunner>> ranks_;
  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable start_cv_, done_cv_;
  uint64_t generation_ = 0;  // bumped per step; a worker runs each generation once
  int pending_ = 0;
  bool stop_ = false;
  const StepInput* input_ = nullptr;
  std::vector<StepOutput> outputs_;
  std::vector<Status> statuses_;
  std::unique_ptr<PrefillLane> lane_;  // reads the ranks' memory: destroyed first
};

}  // namespace moonrun
