#pragma once
// The control plane of a multi-node group (SGLang's --nnodes / --node-rank /
// --dist-init-addr): one process per node; node 0 runs the HTTP server and the scheduler,
// every node runs its ranks' share of each step. Over ZeroMQ (as SGLang and vLLM do):
//
//   PORT    control: node 0's ROUTER, a DEALER per node. Rendezvous (HELLO -> WELCOME),
//           the pool sizing (each node's BUDGET -> node 0's CACHE -> READY), then one
//           STEP per engine step and a DONE per node; SHUTDOWN / ABORT at the end.
//   PORT+1  the CPU backend's collectives hub (backend/cpu/zmq_comm.h); GPUs use NCCL.
//   PORT+2  heartbeats, both ways, every 500 ms, on threads of their own, so a node that
//           is loading or inside a long step still answers.
//
// Failure is loud: a node that never joins, stops answering (its heartbeats stop for
// --dist-timeout) or fails a step makes node 0 fail its requests, turn /health to 503
// and exit non-zero, and every other node exits non-zero too: the followers on ABORT, or
// when node 0's heartbeats stop.
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cache/cache_manager.h"
#include "common/status.h"
#include "runtime/model_runner.h"
#include "runtime/runtime_builder.h"

namespace moonrun {

struct ClusterOptions {
  int nnodes = 1;
  int node_rank = 0;
  std::string dist_init_addr;  // HOST:PORT of node 0
  double timeout_s = 60;       // --dist-timeout
  // What every node must agree on (version, model, parallel sizes, dtypes): node 0 refuses
  // a node whose fingerprint differs, naming both.
  std::string fingerprint;
  // GPUs: the NCCL rendezvous id node 0 made (hex), handed to every node in WELCOME; with
  // --pp-size > 1 one a group instead (runtime/parallel_groups.h numbers them).
  std::string nccl_id_hex;
  std::vector<std::string> nccl_group_ids_hex;
};

struct ClusterEndpoints {
  std::string host;
  int port = 0;
  std::string bind(int offset) const { return "tcp://*:" + std::to_string(port + offset); }
  std::string connect(int offset) const { return "tcp://" + host + ":" + std::to_string(port + offset); }
};
Result<ClusterEndpoints> parse_dist_init_addr(const std::string& addr);

// Node 0's side.
class Coordinator {
 public:
  // Binds, waits up to timeout_s for every other node's HELLO (checking fingerprints),
  // welcomes them and starts the heartbeats.
  static Result<std::unique_ptr<Coordinator>> start(const ClusterOptions& options);
  ~Coordinator();

  // Each other node's pool budget (bytes one of its ranks may give the caches), as they
  // finish loading.
  Result<std::vector<int64_t>> gather_budgets();
  // The pool configuration every node builds; returns once every node is READY.
  Status send_cache_config(const CacheConfig& cache);
  // One engine step: sent to every node before node 0 runs its ranks, then every DONE.
  Status send_step(const std::string& step_bytes);
  Status wait_step_done();
  // The end: SHUTDOWN (clean) or ABORT (why) to every node. Idempotent.
  void stop(bool failure, const std::string& why);

  // Set once a node stops answering or fails: what happened, for the log and the errors.
  bool failed() const { return failed_.load(); }
  std::string failure() const;

 private:
  struct Impl;
  explicit Coordinator(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
  std::atomic<bool> failed_{false};
};

// Every other node's side.
class Follower {
 public:
  // Connects, says HELLO, waits up to timeout_s for WELCOME; starts the heartbeats.
  static Result<std::unique_ptr<Follower>> connect(const ClusterOptions& options);
  ~Follower();

  Status send_budget(int64_t budget_bytes);
  Result<CacheConfig> receive_cache_config();
  Status send_ready(const Status& status);
  // Runs every STEP node 0 sends through `runner` until SHUTDOWN (returns 0) or a failure
  // (ABORT, node 0 gone, a step that failed: returns 1 after logging why).
  int serve(StepRunner& runner);
  // Reports a failure of this node (e.g. its load) to node 0 before exiting.
  void report_failure(const std::string& why);
  // Node 0's NCCL id, from WELCOME (empty on the CPU backend), and its ids of every group
  // under stages (RuntimeOptions::nccl_group_ids_hex).
  const std::string& nccl_id_hex() const;
  const std::vector<std::string>& nccl_group_ids_hex() const;

 private:
  struct Impl;
  explicit Follower(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Node 0's runner: each step goes to every node, then through the local ranks.
class DistributedRunner final : public StepRunner {
 public:
  DistributedRunner(std::shared_ptr<Coordinator> coordinator, std::unique_ptr<StepRunner> local);
  Status step(const StepInput& input, StepOutput& output) override;
  int vocab() const override { return local_->vocab(); }
  RunnerStats stats() const override { return local_->stats(); }
  int64_t free_bytes() const override { return local_->free_bytes(); }

 private:
  std::shared_ptr<Coordinator> coordinator_;
  std::unique_ptr<StepRunner> local_;
  Status failed_ = Status::ok();
};

}  // namespace moonrun

namespace moonrun {

// The runtime options of one node of the group: its ranks (tp_size / nnodes of them,
// starting at node_rank times that), and on the CPU backend collectives over ZeroMQ
// through rank 0's hub.
Result<RuntimeOptions> node_runtime_options(const RuntimeOptions& base, const ClusterOptions& cluster);

// Node 0: loads its ranks, sizes the pools from the smallest budget of every node, has
// every node build its runner, and returns the runtime whose runner drives the group.
Result<Runtime> build_node0_runtime(const std::string& model_dir, const RuntimeOptions& options,
                                    std::shared_ptr<Coordinator> coordinator);

// Every other node: joins, loads its ranks, builds its runner with node 0's pool sizes and
// serves steps until node 0 ends the group. Returns the process's exit code.
int run_follower_node(const std::string& model_dir, const RuntimeOptions& options, const ClusterOptions& cluster);

}  // namespace moonrun
