#pragma once
// One client's TCP connection, read by the event loop (Boost.Beast's HTTP/1.1 parser on an
// Asio strand), written by the worker thread that answers its request.
//
// Why this shape (docs/architecture.md, "HTTP layer"): a slow or hostile client must cost
// a file descriptor and a few kilobytes, never a thread. Reading a request is therefore
// asynchronous and bounded by deadlines that do not restart on every byte:
//   idle    waiting for the first byte of a request (keep-alive)     --http-idle-timeout
//   header  first byte to the end of the header block                --http-header-timeout
//   body    end of headers to the end of the body (any encoding)     --http-body-timeout
// and by sizes: 64 KiB of headers (431), --max-request-bytes of body after chunked and
// gzip/deflate decoding (413). Content-Length must be one plain decimal number, given once;
// a Transfer-Encoding other than "chunked" is refused (501), as RFC 9112 asks.
// Only a request that arrived whole goes to a worker thread. While a worker owns the
// connection no asynchronous operation is pending on it, so the worker writes the answer
// with plain send() calls bounded by --http-write-timeout, and asks gone() (a poll for
// POLLRDHUP/POLLHUP/POLLERR) whether the client is still there during a long generation.
// Pipelined requests wait in the read buffer and are parsed after the answer went out.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "server/http_types.h"

namespace moonrun::server {

struct HttpLimits {
  size_t max_body_bytes = 32u << 20;     // decoded body
  size_t max_header_bytes = 64u << 10;
  double idle_timeout_s = 15;
  double header_timeout_s = 10;
  double body_timeout_s = 60;
  double write_timeout_s = 30;           // one chunk, or a whole small answer
};

class Connection;

// What the event loop asks of the server (implemented by HttpServer).
class ConnectionOwner {
 public:
  virtual ~ConnectionOwner() = default;
  // A whole request arrived; the connection now belongs to the callee until it calls
  // Connection::release().
  virtual void on_request(std::shared_ptr<Connection> conn, HttpRequest request, bool keep_alive) = 0;
  // The event loop answered by itself (a malformed or over-limit request, a timeout).
  virtual void on_rejected(const std::string& remote, int status, const std::string& why) = 0;
  virtual void on_destroyed(Connection* conn) = 0;
  virtual bool draining() const = 0;
};

// Whether the peer of a connected socket went away: closed (FIN), reset, or an error.
// POLLIN is not asked for, so a pipelined next request is not mistaken for a disconnect;
// a client that half-closes (shutdown(SHUT_WR)) counts as gone, as in nginx (its 499).
bool socket_peer_gone(int fd);

class Connection : public std::enable_shared_from_this<Connection> {
 public:
  enum class State { kIdle, kHeader, kBody, kProcessing, kClosed };
  using Clock = std::chrono::steady_clock;

  // socket_fd_owner: an opaque Asio socket handed over by the acceptor (see .cpp).
  static std::shared_ptr<Connection> create(void* asio_socket, const HttpLimits& limits, ConnectionOwner& owner);
  ~Connection();

  void start();   // reads the first request (call once, from any thread)
  // The worker is done with the connection: read the next request (keep_alive) or close.
  void release(bool keep_alive);
  // From any thread (eviction, shutdown): closes an idle or reading connection on its strand.
  // One a worker owns is only shut down (its descriptor stays open until release(), so the
  // number cannot be reused under the worker's send()).
  void close();
  // From any thread: makes blocked and future writes fail at once (shutdown(SHUT_RDWR));
  // the descriptor stays open until close(), so it cannot be reused under a writer.
  void shutdown_socket();

  // Worker side, while the connection is kProcessing.
  bool write_all(std::string_view data, Clock::time_point deadline);
  bool gone() const { return socket_peer_gone(fd_); }
  // A small canned answer (status line, JSON body) and close; from the event loop.
  void reject(int status, const std::string& body, const std::string& extra_headers = "");

  State state() const { return state_.load(); }
  Clock::time_point state_since() const { return Clock::time_point(Clock::duration(since_.load())); }
  const std::string& remote_addr() const { return remote_addr_; }
  int remote_port() const { return remote_port_; }
  int fd() const { return fd_; }
  const HttpLimits& limits() const { return limits_; }

 private:
  struct Impl;
  Connection(const HttpLimits& limits, ConnectionOwner& owner);
  void set_state(State s);
  void read_request();  // on the strand
  void read_header();
  void on_header();
  void read_body();
  void on_body();
  void fail(int status, const std::string& why);
  void close_now();  // on the strand
  void arm_deadline(double seconds_from_now);
  void disarm_deadline();

  std::unique_ptr<Impl> impl_;
  HttpLimits limits_;
  ConnectionOwner& owner_;
  int fd_ = -1;
  std::string remote_addr_;
  int remote_port_ = 0;
  std::atomic<State> state_{State::kIdle};
  std::atomic<int64_t> since_{0};
};

}  // namespace moonrun::server
