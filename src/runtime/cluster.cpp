#include "runtime/cluster.h"

#include <zmq.h>

#include <chrono>
#include <cstdio>
#include <map>
#include <mutex>
#include <thread>

#include <nlohmann/json.hpp>

#include "backend/cpu/zmq_comm.h"
#include "common/log.h"
#include "model/checkpoint.h"
#include "runtime/runtime_builder.h"
#include "runtime/step_codec.h"

namespace moonrun {

namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;
constexpr int kControl = 0, kHeartbeat = 2;  // port offsets (+1 is the CPU collectives hub)
constexpr auto kHeartbeatEvery = std::chrono::milliseconds(500);

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// One ZeroMQ socket (and its context), used by one thread at a time.
class Socket {
 public:
  Socket(int type, const std::string& identity = "") : ctx_(zmq_ctx_new()), s_(zmq_socket(ctx_, type)) {
    const int linger = 0;
    zmq_setsockopt(s_, ZMQ_LINGER, &linger, sizeof linger);
    if (!identity.empty()) zmq_setsockopt(s_, ZMQ_ROUTING_ID, identity.data(), identity.size());
  }
  ~Socket() {
    zmq_close(s_);
    zmq_ctx_term(ctx_);
  }
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;

  Status bind(const std::string& ep) {
    if (zmq_bind(s_, ep.c_str()) == 0) return Status::ok();
    return unavailable("cannot listen on " + ep + ": " + zmq_strerror(zmq_errno()));
  }
  Status connect(const std::string& ep) {
    if (zmq_connect(s_, ep.c_str()) == 0) return Status::ok();
    return unavailable("cannot connect to " + ep + ": " + zmq_strerror(zmq_errno()));
  }
  bool send(const std::vector<std::string>& parts) {
    for (size_t i = 0; i < parts.size(); ++i)
      if (zmq_send(s_, parts[i].data(), parts[i].size(), i + 1 < parts.size() ? ZMQ_SNDMORE : 0) < 0) return false;
    return true;
  }
  // The next message within timeout_ms (-1: wait), or an empty vector.
  std::vector<std::string> recv(int timeout_ms) {
    zmq_pollitem_t item{s_, 0, ZMQ_POLLIN, 0};
    std::vector<std::string> parts;
    if (zmq_poll(&item, 1, timeout_ms) <= 0) return parts;
    int more = 1;
    while (more) {
      zmq_msg_t msg;
      zmq_msg_init(&msg);
      if (zmq_msg_recv(&msg, s_, 0) < 0) {
        zmq_msg_close(&msg);
        return {};
      }
      parts.emplace_back(static_cast<const char*>(zmq_msg_data(&msg)), zmq_msg_size(&msg));
      more = zmq_msg_more(&msg);
      zmq_msg_close(&msg);
    }
    return parts;
  }

 private:
  void* ctx_;
  void* s_;
};

std::string node_id(int k) { return "node-" + std::to_string(k); }

int node_of(const std::string& identity) {
  if (identity.rfind("node-", 0) != 0) return -1;
  try {
    return std::stoi(identity.substr(5));
  } catch (...) {
    return -1;
  }
}

json cache_to_json(const CacheConfig& c) {
  return {{"kv_bytes_per_token", c.layout.kv_bytes_per_token}, {"state_bytes_per_slot", c.layout.state_bytes_per_slot},
          {"page_size_tokens", c.page_size_tokens},            {"num_pages", c.num_pages},
          {"num_state_slots", c.num_state_slots},              {"num_snapshot_slots", c.num_snapshot_slots},
          {"prefix_block_tokens", c.prefix_block_tokens},  {"num_verify_slots", c.num_verify_slots},
          {"kv_dtype", c.layout.kv_dtype ? dtype_name(*c.layout.kv_dtype) : ""}};
}

CacheConfig cache_from_json(const json& j) {
  CacheConfig c;
  c.layout.kv_bytes_per_token = j.at("kv_bytes_per_token").get<int64_t>();
  c.layout.state_bytes_per_slot = j.at("state_bytes_per_slot").get<int64_t>();
  c.page_size_tokens = j.at("page_size_tokens").get<int>();
  c.num_pages = j.at("num_pages").get<int>();
  c.num_state_slots = j.at("num_state_slots").get<int>();
  c.num_snapshot_slots = j.at("num_snapshot_slots").get<int>();
  c.prefix_block_tokens = j.at("prefix_block_tokens").get<int>();
  c.num_verify_slots = j.value("num_verify_slots", 0);
  if (auto kv = dtype_from_name(j.value("kv_dtype", "")); kv.is_ok()) c.layout.kv_dtype = *kv;  // "": unset
  return c;
}

// The heartbeat thread of either side: sends "HB" to its peers every 500 ms, and calls
// on_silent(who) once a peer has not been heard from for timeout_s.
class Heartbeats {
 public:
  // Node 0: a ROUTER that knows nodes 1..n-1. A follower: a DEALER to node 0.
  Heartbeats(const ClusterOptions& o, const ClusterEndpoints& ep, std::function<void(const std::string&)> on_silent)
      : o_(o), on_silent_(std::move(on_silent)) {
    const bool hub = o.node_rank == 0;
    socket_ = std::make_unique<Socket>(hub ? ZMQ_ROUTER : ZMQ_DEALER, hub ? "" : node_id(o.node_rank));
    setup_ = hub ? socket_->bind(ep.bind(kHeartbeat)) : socket_->connect(ep.connect(kHeartbeat));
    const auto now = Clock::now();
    if (hub)
      for (int k = 1; k < o.nnodes; ++k) last_seen_[k] = now;
    else
      last_seen_[0] = now;
    if (setup_.is_ok()) thread_ = std::thread([this] { run(); });
  }
  ~Heartbeats() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  const Status& setup() const { return setup_; }

 private:
  void run() {
    const bool hub = o_.node_rank == 0;
    auto next_send = Clock::now();
    bool reported = false;
    while (!stop_) {
      if (Clock::now() >= next_send) {
        if (hub) {
          for (int k = 1; k < o_.nnodes; ++k) socket_->send({node_id(k), "HB"});
        } else {
          socket_->send({"HB"});
        }
        next_send = Clock::now() + kHeartbeatEvery;
      }
      auto msg = socket_->recv(100);
      if (!msg.empty()) {
        const int from = hub ? node_of(msg[0]) : 0;
        if (last_seen_.count(from)) last_seen_[from] = Clock::now();
      }
      for (const auto& [node, seen] : last_seen_) {
        if (reported || seconds_since(seen) < o_.timeout_s) continue;
        reported = true;
        on_silent_("node " + std::to_string(node) + " has not answered for " +
                   std::to_string(static_cast<int>(o_.timeout_s)) + " s (--dist-timeout): it is gone or unreachable");
      }
    }
  }

  ClusterOptions o_;
  std::function<void(const std::string&)> on_silent_;
  std::unique_ptr<Socket> socket_;
  Status setup_ = Status::ok();
  std::map<int, Clock::time_point> last_seen_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace

Result<ClusterEndpoints> parse_dist_init_addr(const std::string& addr) {
  const size_t colon = addr.rfind(':');
  if (addr.empty() || colon == std::string::npos || colon == 0)
    return invalid_argument("--dist-init-addr must be HOST:PORT (node 0's address), got \"" + addr + "\"");
  ClusterEndpoints ep;
  ep.host = addr.substr(0, colon);
  if (ep.host.size() > 2 && ep.host.front() == '[' && ep.host.back() == ']') ep.host = ep.host.substr(1, ep.host.size() - 2);
  try {
    size_t used = 0;
    ep.port = std::stoi(addr.substr(colon + 1), &used);
    if (used != addr.size() - colon - 1) throw std::invalid_argument("port");
  } catch (...) {
    return invalid_argument("--dist-init-addr " + addr + ": the port is not a number");
  }
  if (ep.port < 1 || ep.port > 65533)
    return invalid_argument("--dist-init-addr " + addr + ": the port must be in [1, 65533] (it and the next two are used)");
  return ep;
}

// ---- node 0 -------------------------------------------------------------------------------

struct Coordinator::Impl {
  ClusterOptions o;
  ClusterEndpoints ep;
  Socket control{ZMQ_ROUTER};
  std::unique_ptr<Heartbeats> heartbeats;
  mutable std::mutex mu;
  std::string failure;
  uint64_t step_seq = 0;
  bool stopped = false;

  // The next control message from a node: [node, type, payload], or empty on timeout.
  std::vector<std::string> next(int timeout_ms) {
    auto m = control.recv(timeout_ms);
    if (m.size() < 2) return {};
    if (m.size() == 2) m.push_back("");
    return m;
  }
};

Coordinator::Coordinator(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Coordinator::~Coordinator() {
  stop(false, "node 0 is shutting down");
  impl_->heartbeats.reset();
}

std::string Coordinator::failure() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->failure;
}

Result<std::unique_ptr<Coordinator>> Coordinator::start(const ClusterOptions& o) {
  auto impl = std::make_unique<Impl>();
  impl->o = o;
  impl->ep = MR_TRY(parse_dist_init_addr(o.dist_init_addr));
  MR_RETURN_IF_ERROR(impl->control.bind(impl->ep.bind(kControl)));
  MR_LOG(INFO) << "Waiting for " << o.nnodes - 1 << " node(s) at " << o.dist_init_addr << " (--dist-timeout "
               << o.timeout_s << " s)";
  std::map<int, bool> joined;
  const auto t0 = Clock::now();
  std::string refused;
  while (static_cast<int>(joined.size()) < o.nnodes - 1) {
    const double left = o.timeout_s - seconds_since(t0);
    if (left <= 0) {
      std::string missing;
      for (int k = 1; k < o.nnodes; ++k)
        if (!joined.count(k)) missing += (missing.empty() ? "" : ", ") + std::to_string(k);
      return unavailable("node(s) " + missing + " of " + std::to_string(o.nnodes) + " did not join within " +
                         std::to_string(static_cast<int>(o.timeout_s)) +
                         " s (--dist-timeout): each node runs the same command with its own --node-rank and "
                         "--dist-init-addr " + o.dist_init_addr);
    }
    auto m = impl->next(static_cast<int>(std::min(left, 1.0) * 1000));
    if (m.empty() || m[1] != "HELLO") continue;
    const int k = node_of(m[0]);
    const json hello = json::parse(m[2], nullptr, false);
    std::string why;
    if (k <= 0 || k >= o.nnodes) why = "node rank " + std::to_string(k) + " is outside [1, " + std::to_string(o.nnodes) + ")";
    else if (joined.count(k)) why = "a second node says it is node " + std::to_string(k);
    else if (!hello.is_object() || hello.value("fingerprint", "") != o.fingerprint)
      why = "node " + std::to_string(k) + " runs another configuration: " +
            (hello.is_object() ? hello.value("fingerprint", "?") : std::string("?")) + " vs node 0's " + o.fingerprint;
    if (!why.empty()) {
      impl->control.send({m[0], "WELCOME", json{{"ok", false}, {"error", why}}.dump()});
      refused = why;
      if (k > 0 && k < o.nnodes && !joined.count(k)) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));  // let the refusal leave
        return invalid_argument(why);
      }
      continue;
    }
    joined[k] = true;
    MR_LOG(INFO) << "Node " << k << " joined (" << joined.size() << " of " << o.nnodes - 1 << ")";
  }
  const std::string welcome =
      json{{"ok", true}, {"nccl_id", o.nccl_id_hex}, {"nccl_group_ids", o.nccl_group_ids_hex}}.dump();
  for (int k = 1; k < o.nnodes; ++k) impl->control.send({node_id(k), "WELCOME", welcome});
  std::unique_ptr<Coordinator> c(new Coordinator(std::move(impl)));
  Coordinator* raw = c.get();
  c->impl_->heartbeats = std::make_unique<Heartbeats>(o, c->impl_->ep, [raw](const std::string& why) {
    {
      std::lock_guard<std::mutex> lock(raw->impl_->mu);
      if (raw->impl_->failure.empty()) raw->impl_->failure = why;
    }
    raw->failed_ = true;
    MR_LOG(ERROR) << "Distributed group failed: " << why;
  });
  MR_RETURN_IF_ERROR(c->impl_->heartbeats->setup());
  return c;
}

Result<std::vector<int64_t>> Coordinator::gather_budgets() {
  std::vector<int64_t> budgets(static_cast<size_t>(impl_->o.nnodes), -1);
  int got = 0;
  while (got < impl_->o.nnodes - 1) {
    if (failed()) return unavailable(failure());
    auto m = impl_->next(200);
    if (m.empty()) continue;
    const int k = node_of(m[0]);
    if (m[1] == "FAILED") return unavailable("node " + std::to_string(k) + " failed: " + m[2]);
    if (m[1] != "BUDGET" || k <= 0 || k >= impl_->o.nnodes || budgets[k] >= 0) continue;
    budgets[k] = std::stoll(m[2]);
    ++got;
  }
  budgets.erase(budgets.begin());
  return budgets;
}

Status Coordinator::send_cache_config(const CacheConfig& cache) {
  const std::string body = cache_to_json(cache).dump();
  for (int k = 1; k < impl_->o.nnodes; ++k) impl_->control.send({node_id(k), "CACHE", body});
  int ready = 0;
  while (ready < impl_->o.nnodes - 1) {
    if (failed()) return unavailable(failure());
    auto m = impl_->next(200);
    if (m.empty()) continue;
    const int k = node_of(m[0]);
    if (m[1] == "FAILED") return unavailable("node " + std::to_string(k) + " failed: " + m[2]);
    if (m[1] == "READY") ++ready;
  }
  return Status::ok();
}

Status Coordinator::send_step(const std::string& step_bytes) {
  if (failed()) return unavailable(failure());
  ++impl_->step_seq;
  const std::string seq = std::to_string(impl_->step_seq);
  for (int k = 1; k < impl_->o.nnodes; ++k)
    if (!impl_->control.send({node_id(k), "STEP", seq, step_bytes}))
      return unavailable("sending the step to node " + std::to_string(k) + " failed");
  return Status::ok();
}

Status Coordinator::wait_step_done() {
  const std::string seq = std::to_string(impl_->step_seq);
  int done = 0;
  Status first = Status::ok();
  while (done < impl_->o.nnodes - 1) {
    if (failed()) return unavailable(failure());
    auto m = impl_->control.recv(200);
    if (m.size() < 3) continue;
    const int k = node_of(m[0]);
    if (m[1] == "FAILED") return unavailable("node " + std::to_string(k) + " failed: " + (m.size() > 2 ? m[2] : ""));
    if (m[1] != "DONE" || m[2] != seq) continue;
    ++done;
    if (m.size() > 3 && !m[3].empty() && first.is_ok())
      first = internal_error("node " + std::to_string(k) + ": " + m[3]);
  }
  return first;
}

void Coordinator::stop(bool failure, const std::string& why) {
  if (impl_->stopped) return;
  impl_->stopped = true;
  for (int k = 1; k < impl_->o.nnodes; ++k) impl_->control.send({node_id(k), failure ? "ABORT" : "SHUTDOWN", why});
  // Give the messages a moment to leave before the socket closes.
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
}

// ---- the other nodes ----------------------------------------------------------------------

struct Follower::Impl {
  ClusterOptions o;
  ClusterEndpoints ep;
  std::unique_ptr<Socket> control;
  std::unique_ptr<Heartbeats> heartbeats;
  std::mutex mu;
  std::string node0_gone;  // set by the heartbeat thread
  std::string nccl_id;
  std::vector<std::string> nccl_group_ids;
  std::atomic<bool> gone{false};

  std::vector<std::string> next(int timeout_ms) { return control->recv(timeout_ms); }
};

Follower::Follower(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Follower::~Follower() { impl_->heartbeats.reset(); }

Result<std::unique_ptr<Follower>> Follower::connect(const ClusterOptions& o) {
  auto impl = std::make_unique<Impl>();
  impl->o = o;
  impl->ep = MR_TRY(parse_dist_init_addr(o.dist_init_addr));
  impl->control = std::make_unique<Socket>(ZMQ_DEALER, node_id(o.node_rank));
  MR_RETURN_IF_ERROR(impl->control->connect(impl->ep.connect(kControl)));
  impl->control->send({"HELLO", json{{"fingerprint", o.fingerprint}}.dump()});
  MR_LOG(INFO) << "Node " << o.node_rank << " of " << o.nnodes << ": joining node 0 at " << o.dist_init_addr;
  const auto t0 = Clock::now();
  while (true) {
    const double left = o.timeout_s - seconds_since(t0);
    if (left <= 0)
      return unavailable("node 0 at " + o.dist_init_addr + " did not answer within " +
                         std::to_string(static_cast<int>(o.timeout_s)) + " s (--dist-timeout)");
    auto m = impl->next(static_cast<int>(std::min(left, 1.0) * 1000));
    if (m.size() < 2 || m[0] != "WELCOME") continue;
    const json w = json::parse(m[1], nullptr, false);
    if (!w.is_object() || !w.value("ok", false))
      return invalid_argument("node 0 refused this node: " + (w.is_object() ? w.value("error", "?") : m[1]));
    impl->nccl_id = w.value("nccl_id", "");
    if (w.contains("nccl_group_ids") && w["nccl_group_ids"].is_array())
      for (const json& id : w["nccl_group_ids"])
        if (id.is_string()) impl->nccl_group_ids.push_back(id.get<std::string>());
    break;
  }
  std::unique_ptr<Follower> f(new Follower(std::move(impl)));
  Impl* raw = f->impl_.get();
  f->impl_->heartbeats = std::make_unique<Heartbeats>(o, f->impl_->ep, [raw](const std::string& why) {
    {
      std::lock_guard<std::mutex> lock(raw->mu);
      raw->node0_gone = why;
    }
    raw->gone = true;
  });
  MR_RETURN_IF_ERROR(f->impl_->heartbeats->setup());
  MR_LOG(INFO) << "Node " << o.node_rank << " joined the group";
  return f;
}

Status Follower::send_budget(int64_t budget_bytes) {
  impl_->control->send({"BUDGET", std::to_string(budget_bytes)});
  return Status::ok();
}

Result<CacheConfig> Follower::receive_cache_config() {
  while (true) {
    if (impl_->gone) {
      std::lock_guard<std::mutex> lock(impl_->mu);
      return unavailable(impl_->node0_gone);
    }
    auto m = impl_->next(200);
    if (m.empty()) continue;
    if (m[0] == "ABORT") return unavailable("node 0 aborted: " + (m.size() > 1 ? m[1] : std::string()));
    if (m[0] == "SHUTDOWN") return unavailable("node 0 shut down before serving");
    if (m[0] != "CACHE" || m.size() < 2) continue;
    const json j = json::parse(m[1], nullptr, false);
    if (!j.is_object()) return data_loss("node 0 sent a malformed cache configuration");
    return cache_from_json(j);
  }
}

Status Follower::send_ready(const Status& status) {
  if (status.is_ok()) impl_->control->send({"READY", ""});
  else impl_->control->send({"FAILED", status.message()});
  return Status::ok();
}

const std::string& Follower::nccl_id_hex() const { return impl_->nccl_id; }
const std::vector<std::string>& Follower::nccl_group_ids_hex() const { return impl_->nccl_group_ids; }

void Follower::report_failure(const std::string& why) {
  impl_->control->send({"FAILED", why});
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
}

int Follower::serve(StepRunner& runner) {
  const int k = impl_->o.node_rank;
  MR_LOG(INFO) << "Node " << k << " is serving its ranks' share of every step";
  while (true) {
    if (impl_->gone) {
      std::lock_guard<std::mutex> lock(impl_->mu);
      MR_LOG(ERROR) << "Node " << k << " exits: " << impl_->node0_gone;
      return 1;
    }
    auto m = impl_->next(200);
    if (m.empty()) continue;
    if (m[0] == "SHUTDOWN") {
      MR_LOG(INFO) << "Node 0 shut down; node " << k << " exits";
      return 0;
    }
    if (m[0] == "ABORT") {
      MR_LOG(ERROR) << "Node " << k << " exits: node 0 aborted the group: " << (m.size() > 1 ? m[1] : "");
      return 1;
    }
    if (m[0] != "STEP" || m.size() < 3) continue;
    auto step = decode_step(m[2]);
    Status st = step.is_ok() ? Status::ok() : step.status();
    if (st.is_ok()) {
      StepOutput out;
      st = runner.step(step->input, out);
    }
    impl_->control->send({"DONE", m[1], st.is_ok() ? std::string() : st.message()});
    if (!st.is_ok()) {
      MR_LOG(ERROR) << "Node " << k << " exits: a step failed: " << st.message();
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      return 1;
    }
  }
}

// ---- node 0's runner ----------------------------------------------------------------------

DistributedRunner::DistributedRunner(std::shared_ptr<Coordinator> coordinator, std::unique_ptr<StepRunner> local)
    : coordinator_(std::move(coordinator)), local_(std::move(local)) {}

Status DistributedRunner::step(const StepInput& input, StepOutput& output) {
  if (!failed_.is_ok()) return failed_;
  Status st = coordinator_->send_step(encode_step(input));
  if (st.is_ok()) {
    st = local_->step(input, output);
    const Status done = coordinator_->wait_step_done();
    if (st.is_ok()) st = done;
  }
  if (!st.is_ok()) {
    // The group is broken: say why (a silent node explains a collective's timeout), and
    // tell the other nodes to exit.
    if (coordinator_->failed()) st = unavailable("distributed group failed: " + coordinator_->failure());
    coordinator_->stop(true, st.message());
    failed_ = st;
  }
  return st;
}

// ---- a node's runtime ---------------------------------------------------------------------

Result<RuntimeOptions> node_runtime_options(const RuntimeOptions& base, const ClusterOptions& cluster) {
  RuntimeOptions o = base;
  if (cluster.nnodes < 1 || cluster.node_rank < 0 || cluster.node_rank >= cluster.nnodes)
    return invalid_argument("--node-rank " + std::to_string(cluster.node_rank) + " is outside [0, " +
                            std::to_string(cluster.nnodes) + ")");
  // Ranks in order: stage s on [s * tp, (s + 1) * tp), so with --pp-size a node holds whole
  // stages (or a part of one).
  const int world = o.tp_size * std::max(o.pp_size, 1);
  if (world % cluster.nnodes != 0)
    return invalid_argument("--tp-size " + std::to_string(o.tp_size) +
                            (o.pp_size > 1 ? " x --pp-size " + std::to_string(o.pp_size) : std::string()) +
                            " does not split over --nnodes " + std::to_string(cluster.nnodes) +
                            " (every node runs the same number of ranks)");
  const ClusterEndpoints ep = MR_TRY(parse_dist_init_addr(cluster.dist_init_addr));
  o.local_ranks = world / cluster.nnodes;
  o.first_rank = cluster.node_rank * o.local_ranks;
  if (o.device == "cuda") {
    // GPUs: NCCL across the nodes, from node 0's id (a follower's arrives in WELCOME).
    o.nccl_id_hex = cluster.nccl_id_hex;
    o.nccl_group_ids_hex = cluster.nccl_group_ids_hex;
    o.nccl_at_one_rank = true;
    return o;
  }
  const double timeout = cluster.timeout_s;
  // The CPU backend's collectives across processes (a GPU build uses NCCL instead): a hub
  // per group (RuntimeOptions::make_comm), group 0's at PORT+1, group g > 0's at PORT+2+g.
  const int groups = o.pp_size > 1 ? o.pp_size + o.pp_size * o.tp_size : 1;
  if (ep.port + 2 + groups > 65535)
    return invalid_argument("--dist-init-addr port " + std::to_string(ep.port) + ": the CPU ranks' " +
                            std::to_string(groups) + " groups need ports up to " + std::to_string(ep.port + 2 + groups));
  // A group's hub is on the node of its rank 0: node 0's at --dist-init-addr; another
  // node's only for a group wholly on that node (on its loopback), since the nodes do not
  // learn each other's addresses (a ring link between two later nodes: more than 2 stages
  // on more than 2 CPU nodes).
  o.make_comm = [ep, timeout](int group, int rank, int size, int hub_node,
                              bool one_node) -> Result<std::unique_ptr<Communicator>> {
    const int offset = group == 0 ? 1 : 2 + group;
    if (hub_node != 0 && !one_node)
      return unimplemented("CPU ranks on several nodes: a group between nodes " + std::to_string(hub_node) +
                           " and later has no address to meet at (only node 0's is known); run at most 2 "
                           "CPU nodes per --pp-size ring, or GPUs");
    cpu::ZmqCommOptions z;
    z.rank = rank;
    z.size = size;
    const std::string local_hub = "tcp://127.0.0.1:" + std::to_string(ep.port + offset);
    z.hub_endpoint = rank == 0 ? ep.bind(offset) : hub_node == 0 ? ep.connect(offset) : local_hub;
    z.timeout_s = timeout;
    return cpu::make_zmq_comm(z);
  };
  return o;
}

Result<Runtime> build_node0_runtime(const std::string& model_dir, const RuntimeOptions& o,
                                    std::shared_ptr<Coordinator> coordinator) {
  auto loaded = load_ranks(model_dir, o);
  if (!loaded.is_ok()) {
    coordinator->stop(true, "node 0 could not load: " + loaded.status().message());
    return loaded.status();
  }
  LoadedRanks& lr = *loaded;
  const std::vector<int64_t> budgets = MR_TRY(coordinator->gather_budgets());
  int64_t budget = lr.budget_bytes;
  for (int64_t b : budgets) budget = std::min(budget, b);
  char gb[32];
  std::snprintf(gb, sizeof gb, "%.2f", budget / 1e9);
  MR_LOG(INFO) << "Every node loaded; the pools are sized from the smallest budget: " << gb << " GB per rank";
  Runtime rt;
  rt.device = lr.device;
  rt.dtype_name = lr.dtype_name;
  rt.config = lr.config;
  auto cache = size_cache(lr, budget, o);
  if (!cache.is_ok()) {
    coordinator->stop(true, cache.status().message());
    return cache.status();
  }
  rt.cache = *cache;
  MR_RETURN_IF_ERROR(coordinator->send_cache_config(rt.cache));
  auto local = make_runner(lr, rt.cache, o);
  if (!local.is_ok()) {
    coordinator->stop(true, "node 0: " + local.status().message());
    return local.status();
  }
  rt.runner = std::make_unique<DistributedRunner>(std::move(coordinator), std::move(local).value());
  return rt;
}

int run_follower_node(const std::string& model_dir, const RuntimeOptions& o, const ClusterOptions& cluster) {
  auto follower = Follower::connect(cluster);
  if (!follower.is_ok()) {
    MR_LOG(ERROR) << "Node " << cluster.node_rank << ": " << follower.status().message();
    return 1;
  }
  Follower& f = **follower;
  RuntimeOptions mine = o;
  if (mine.device == "cuda") {
    mine.nccl_id_hex = f.nccl_id_hex();
    mine.nccl_group_ids_hex = f.nccl_group_ids_hex();
  }
  auto loaded = load_ranks(model_dir, mine);
  if (!loaded.is_ok()) {
    MR_LOG(ERROR) << "Node " << cluster.node_rank << " could not load: " << loaded.status().message();
    f.report_failure("node " + std::to_string(cluster.node_rank) + " could not load: " + loaded.status().message());
    return 1;
  }
  // A send fails when the leader has gone: say so and stop, rather than wait on a reply.
  if (Status sent = f.send_budget(loaded->budget_bytes); !sent.is_ok()) {
    MR_LOG(ERROR) << "Node " << cluster.node_rank << " could not report its memory budget: " << sent.message();
    return 1;
  }
  auto cache = f.receive_cache_config();
  if (!cache.is_ok()) {
    MR_LOG(ERROR) << "Node " << cluster.node_rank << ": " << cache.status().message();
    return 1;
  }
  auto runner = make_runner(*loaded, *cache, mine);
  if (Status sent = f.send_ready(runner.is_ok() ? Status::ok() : runner.status()); !sent.is_ok()) {
    MR_LOG(ERROR) << "Node " << cluster.node_rank << " could not report ready: " << sent.message();
    return 1;
  }
  if (!runner.is_ok()) {
    MR_LOG(ERROR) << "Node " << cluster.node_rank << ": " << runner.status().message();
    return 1;
  }
  return f.serve(**runner);
}

}  // namespace moonrun
