#pragma once
// The TCP connection behind an HTTP request, so a handler that waits for a generation can
// notice the client going away (closed, reset, killed) and abort it instead of generating
// to max_tokens for nobody.
//
// cpp-httplib 0.11.4 gives handlers neither the socket nor a liveness check; it checks
// liveness itself only when it writes (SocketStream::is_writable: select_write, then a
// MSG_PEEK read that sees EOF or a reset). Streams write, or ask DataSink::is_writable, every
// few tokens and so notice soon; a non-streaming request writes once, at the end. Ways
// considered:
//   - answer through a content provider, to get DataSink::is_writable while waiting: the
//     status line and headers would go out before the result, so an engine failure could no
//     longer be a 500 with an OpenAI error envelope;
//   - override Server::process_and_close_socket to remember the fd per thread: it is a
//     private virtual, so the override would have to re-implement httplib's keep-alive loop
//     (0.11.4 internals) and every connection would run through our copy;
//   - find the socket from what the Request already carries (chosen): httplib fills
//     remote_addr/remote_port and local_addr/local_port from getpeername/getsockname of this
//     very socket, and a live TCP connection's 4-tuple is unique in the kernel. So the one
//     socket among the process's fds (/proc/self/fd) whose getpeername/getsockname, printed
//     the same way (getnameinfo NI_NUMERICHOST), equal those four values is this
//     connection's. The handler's thread owns that connection until the handler returns, so
//     the fd cannot be closed or reused under us. Public API and POSIX only; if the lookup
//     finds nothing (or more than one), found() is false and the request behaves as before.
//     Cost: one getpeername per open fd, once per non-streaming generation request.
//
// What counts as gone: POLLRDHUP (the peer sent FIN: closed, or shut down its sending side),
// POLLHUP or POLLERR (reset). POLLIN is not asked for, so the bytes of a next request sent
// early on a keep-alive connection are not mistaken for a disconnect. A client that only
// half-closes (shutdown(SHUT_WR)) counts as gone, as in nginx (its 499); httplib 0.11.4
// would not write it an answer anyway (the MSG_PEEK above sees its EOF). Linux only
// (/proc, POLLRDHUP), like the rest of the server.
#include <string>

namespace httplib {
struct Request;
}

namespace moonrun::server {

class ClientConnection {
 public:
  ClientConnection() = default;
  // The socket carrying req, looked up among this process's fds; call on the handler's thread.
  static ClientConnection of(const httplib::Request& req);
  // The same lookup from the four values (what `of` reads from the request).
  static ClientConnection find(const std::string& local_addr, int local_port,
                               const std::string& remote_addr, int remote_port);

  bool found() const { return fd_ >= 0; }
  int fd() const { return fd_; }
  // True once the peer closed or reset the connection. Non-blocking: one poll() call.
  // False when not found (nothing is known).
  bool gone() const;

 private:
  explicit ClientConnection(int fd) : fd_(fd) {}
  int fd_ = -1;
};

}  // namespace moonrun::server
