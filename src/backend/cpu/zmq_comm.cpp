#include "backend/cpu/zmq_comm.h"

#include <zmq.h>

#include <chrono>
#include <cstring>
#include <vector>

#include "backend/ops.h"

namespace moonrun::cpu {

namespace {

std::string zmq_error(const char* what) { return std::string(what) + ": " + zmq_strerror(zmq_errno()); }

class ZmqComm final : public Communicator {
 public:
  ZmqComm(const ZmqCommOptions& o, void* ctx, void* socket) : o_(o), ctx_(ctx), socket_(socket) {}
  ~ZmqComm() override {
    zmq_close(socket_);
    zmq_ctx_term(ctx_);
  }

  int rank() const override { return o_.rank; }
  int size() const override { return o_.size; }

  void all_reduce_sum(float* data, size_t n) override {
    if (o_.size == 1) return;
    collective(data, n, /*gather=*/false, data);
  }

  void all_gather(const float* in, size_t n, float* out) override {
    if (o_.size == 1) {
      std::memcpy(out, in, n * sizeof(float));
      return;
    }
    collective(in, n, /*gather=*/true, out);
  }

  void abort(const std::string& why) override { aborted_ = "the parallel group was aborted: " + why; }

 private:
  // One collective: contributions to the hub, the result back. Messages carry the
  // collective's sequence number, so a late message from an earlier one is never mistaken.
  void collective(const float* in, size_t n, bool gather, float* out) {
    if (!aborted_.empty()) throw BackendError(aborted_);
    const uint64_t seq = ++seq_;
    const size_t bytes = n * sizeof(float);
    if (o_.rank != 0) {
      send_parts({{&seq, sizeof seq}, {in, bytes}});
      std::vector<std::string> parts = recv_parts("the result from rank 0");
      check_message(parts, 2, seq, gather ? bytes * o_.size : bytes, "rank 0");
      std::memcpy(out, parts[1].data(), parts[1].size());
      return;
    }
    // The hub: every other rank's buffer, then the result in rank order.
    std::vector<std::string> from(static_cast<size_t>(o_.size));
    std::vector<std::string> identity(static_cast<size_t>(o_.size));
    for (int got = 1; got < o_.size;) {
      std::vector<std::string> parts = recv_parts("rank contributions (" + std::to_string(got) + " of " +
                                                  std::to_string(o_.size - 1) + " arrived)");
      // ROUTER: [identity "rank-R"][seq][data]
      if (parts.size() != 3 || parts[0].rfind("rank-", 0) != 0) throw BackendError("collective: malformed message");
      const int r = std::stoi(parts[0].substr(5));
      if (r <= 0 || r >= o_.size) throw BackendError("collective: a message from unknown rank " + std::to_string(r));
      check_message({parts[1], parts[2]}, 2, seq, bytes, "rank " + std::to_string(r));
      if (!from[r].empty()) throw BackendError("collective: rank " + std::to_string(r) + " sent twice");
      from[r] = std::move(parts[2]);
      identity[r] = std::move(parts[0]);
      ++got;
    }
    std::string result;
    if (gather) {
      result.resize(bytes * o_.size);
      std::memcpy(result.data(), in, bytes);
      for (int r = 1; r < o_.size; ++r) std::memcpy(result.data() + r * bytes, from[r].data(), bytes);
    } else {
      std::vector<float> sum(in, in + n);
      for (int r = 1; r < o_.size; ++r) {
        const float* p = reinterpret_cast<const float*>(from[r].data());
        for (size_t i = 0; i < n; ++i) sum[i] += p[i];
      }
      result.assign(reinterpret_cast<const char*>(sum.data()), bytes);
    }
    for (int r = 1; r < o_.size; ++r)
      send_parts({{identity[r].data(), identity[r].size()}, {&seq, sizeof seq}, {result.data(), result.size()}});
    std::memcpy(out, result.data(), result.size());
  }

  void check_message(const std::vector<std::string>& parts, size_t n_parts, uint64_t seq, size_t bytes,
                     const std::string& who) {
    if (parts.size() != n_parts || parts[0].size() != sizeof(uint64_t))
      throw BackendError("collective: malformed message from " + who);
    uint64_t got;
    std::memcpy(&got, parts[0].data(), sizeof got);
    if (got != seq)
      throw BackendError("collective: " + who + " is at collective " + std::to_string(got) + ", this rank at " +
                         std::to_string(seq) + " (the ranks ran different forwards)");
    if (parts[1].size() != bytes)
      throw BackendError("collective: " + who + " sent " + std::to_string(parts[1].size()) + " bytes, expected " +
                         std::to_string(bytes));
  }

  struct Part {
    const void* data;
    size_t size;
  };
  void send_parts(std::initializer_list<Part> parts) {
    size_t i = 0;
    for (const Part& p : parts) {
      const int flags = ++i < parts.size() ? ZMQ_SNDMORE : 0;
      if (zmq_send(socket_, p.data, p.size, flags) < 0) throw BackendError(zmq_error("collective: send"));
    }
  }

  std::vector<std::string> recv_parts(const std::string& waiting_for) {
    zmq_pollitem_t item{socket_, 0, ZMQ_POLLIN, 0};
    const int timeout_ms = static_cast<int>(o_.timeout_s * 1000);
    const int rc = zmq_poll(&item, 1, timeout_ms);
    if (rc < 0) throw BackendError(zmq_error("collective: poll"));
    if (rc == 0)
      throw BackendError("rank " + std::to_string(o_.rank) + " waited " + std::to_string(static_cast<int>(o_.timeout_s)) +
                         " s (--dist-timeout) for " + waiting_for + ": a peer is gone");
    std::vector<std::string> parts;
    int more = 1;
    while (more) {
      zmq_msg_t msg;
      zmq_msg_init(&msg);
      if (zmq_msg_recv(&msg, socket_, 0) < 0) {
        zmq_msg_close(&msg);
        throw BackendError(zmq_error("collective: receive"));
      }
      parts.emplace_back(static_cast<const char*>(zmq_msg_data(&msg)), zmq_msg_size(&msg));
      more = zmq_msg_more(&msg);
      zmq_msg_close(&msg);
    }
    return parts;
  }

  ZmqCommOptions o_;
  void* ctx_;
  void* socket_;
  uint64_t seq_ = 0;
  std::string aborted_;
};

}  // namespace

Result<std::unique_ptr<Communicator>> make_zmq_comm(const ZmqCommOptions& o) {
  if (o.size < 1 || o.rank < 0 || o.rank >= o.size) return invalid_argument("zmq comm: rank " + std::to_string(o.rank) + " of " + std::to_string(o.size));
  void* ctx = zmq_ctx_new();
  void* s = zmq_socket(ctx, o.rank == 0 ? ZMQ_ROUTER : ZMQ_DEALER);
  const int linger = 0;
  zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof linger);
  int rc;
  if (o.rank == 0) {
    rc = zmq_bind(s, o.hub_endpoint.c_str());
  } else {
    const std::string id = "rank-" + std::to_string(o.rank);
    zmq_setsockopt(s, ZMQ_ROUTING_ID, id.data(), id.size());
    rc = zmq_connect(s, o.hub_endpoint.c_str());
  }
  if (rc != 0) {
    const std::string why = zmq_strerror(zmq_errno());
    zmq_close(s);
    zmq_ctx_term(ctx);
    return unavailable(std::string(o.rank == 0 ? "binding" : "connecting to") + " the collective hub at " +
                       o.hub_endpoint + " failed: " + why);
  }
  return std::unique_ptr<Communicator>(new ZmqComm(o, ctx, s));
}

}  // namespace moonrun::cpu
