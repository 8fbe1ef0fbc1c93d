#include "server/client_connection.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include <cerrno>
#include <optional>

#include "common/log.h"
#include "server/anthropic_error.h"
#include "server/content_decoding.h"
#include "server/openai_error.h"

namespace moonrun::server {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = boost::beast::http;
using tcp = net::ip::tcp;

bool socket_peer_gone(int fd) {
  if (fd < 0) return false;
  pollfd p{fd, POLLRDHUP, 0};
  const int rc = poll(&p, 1, 0);
  if (rc <= 0) return false;  // nothing yet (or EINTR: ask again next time)
  return (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
}

struct Connection::Impl {
  explicit Impl(tcp::socket&& s) : stream(std::move(s)), timer(stream.get_executor()) {}
  beast::tcp_stream stream;
  // The header and body deadlines. Not tcp_stream's own expiry: that closes the socket,
  // and a client that ran out of time should still read why (408).
  net::steady_timer timer;
  uint64_t timer_generation = 0;  // a fired timer whose wait was superseded does nothing
  bool timed_out = false;
  beast::flat_buffer buffer;
  std::optional<http::request_parser<http::string_body>> parser;
  std::string canned;  // a reject() answer being written
};

namespace {
std::chrono::steady_clock::duration seconds(double s) {
  return std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(s));
}

const char* reason_phrase(int status);

std::string envelope(int status, const std::string& message, const char* code) {
  ApiError e{status, message, status >= 500 ? "server_error" : "invalid_request_error", "", code};
  return e.to_json().dump();
}
}  // namespace

std::shared_ptr<Connection> Connection::create(void* asio_socket, const HttpLimits& limits, ConnectionOwner& owner) {
  auto conn = std::shared_ptr<Connection>(new Connection(limits, owner));
  auto* sock = static_cast<tcp::socket*>(asio_socket);
  boost::system::error_code ec;
  const auto ep = sock->remote_endpoint(ec);
  if (!ec) {
    conn->remote_addr_ = ep.address().to_string();
    conn->remote_port_ = ep.port();
  }
  sock->set_option(tcp::no_delay(true), ec);  // SSE chunks are small and must not wait
  conn->fd_ = sock->native_handle();
  conn->impl_ = std::make_unique<Impl>(std::move(*sock));
  return conn;
}

Connection::Connection(const HttpLimits& limits, ConnectionOwner& owner) : limits_(limits), owner_(owner) {
  set_state(State::kIdle);
}

Connection::~Connection() { owner_.on_destroyed(this); }

void Connection::set_state(State s) {
  state_ = s;
  since_ = Clock::now().time_since_epoch().count();
}

void Connection::start() {
  net::dispatch(impl_->stream.get_executor(), [self = shared_from_this()] { self->read_request(); });
}

void Connection::release(bool keep_alive) {
  net::post(impl_->stream.get_executor(), [self = shared_from_this(), keep_alive] {
    if (self->state_ == State::kClosed) return;
    if (!keep_alive || self->owner_.draining()) return self->close_now();
    self->read_request();
  });
}

void Connection::close() {
  net::post(impl_->stream.get_executor(), [self = shared_from_this()] {
    if (self->state_ == State::kClosed) return;
    if (self->state_ == State::kProcessing) return self->shutdown_socket();
    self->close_now();
  });
}

void Connection::close_now() {
  set_state(State::kClosed);
  disarm_deadline();
  boost::system::error_code ec;
  impl_->stream.socket().shutdown(tcp::socket::shutdown_both, ec);
  impl_->stream.close();
}

void Connection::shutdown_socket() {
  if (fd_ >= 0) ::shutdown(fd_, SHUT_RDWR);
}

// ---- reading (all on the strand) ---------------------------------------------------

void Connection::arm_deadline(double seconds_from_now) {
  impl_->stream.expires_never();
  impl_->timed_out = false;
  const uint64_t generation = ++impl_->timer_generation;
  impl_->timer.expires_after(seconds(seconds_from_now));
  impl_->timer.async_wait([self = shared_from_this(), generation](boost::system::error_code ec) {
    if (ec || generation != self->impl_->timer_generation) return;
    self->impl_->timed_out = true;
    boost::system::error_code ignored;
    self->impl_->stream.socket().cancel(ignored);  // the pending read ends with operation_aborted
  });
}

void Connection::disarm_deadline() {
  ++impl_->timer_generation;
  impl_->timer.cancel();
}

void Connection::read_request() {
  if (state_ == State::kClosed) return;
  if (impl_->buffer.size() > 0) return read_header();  // a pipelined request is already here
  set_state(State::kIdle);
  impl_->stream.expires_after(seconds(limits_.idle_timeout_s));
  auto buf = impl_->buffer.prepare(4096);
  impl_->stream.async_read_some(buf, [self = shared_from_this()](beast::error_code ec, size_t n) {
    if (ec) {  // closed, reset, or idle too long: nothing to answer
      MR_LOG(TRACE) << "connection " << self->remote_addr_ << ":" << self->remote_port_ << " closed while idle ("
                    << ec.message() << ")";
      self->set_state(State::kClosed);
      self->impl_->stream.close();
      return;
    }
    self->impl_->buffer.commit(n);
    self->read_header();
  });
}

void Connection::read_header() {
  set_state(State::kHeader);
  impl_->parser.emplace();
  impl_->parser->header_limit(static_cast<uint32_t>(limits_.max_header_bytes));
  // The raw body (before gzip decoding) can never usefully exceed the decoded limit:
  // compression does not make JSON larger. Chunked bodies count their decoded payload.
  impl_->parser->body_limit(limits_.max_body_bytes);
  // One deadline for the whole header block, however the bytes trickle in.
  arm_deadline(limits_.header_timeout_s);
  http::async_read_header(impl_->stream, impl_->buffer, *impl_->parser,
                          [self = shared_from_this()](beast::error_code ec, size_t) {
                            self->disarm_deadline();
                            if (!ec) return self->on_header();
                            if (self->impl_->timed_out)
                              return self->fail(408, "the request headers did not arrive within " +
                                                         std::to_string(self->limits_.header_timeout_s) + " s");
                            if (ec == http::error::header_limit)
                              return self->fail(431, "the request headers are larger than " +
                                                         std::to_string(self->limits_.max_header_bytes) + " bytes");
                            if (ec == http::error::body_limit)
                              return self->fail(413, "the request body is larger than the server's limit of " +
                                                         std::to_string(self->limits_.max_body_bytes) +
                                                         " bytes (--max-request-bytes)");
                            if (ec == http::error::end_of_stream || ec == net::error::eof ||
                                ec == net::error::connection_reset || ec == net::error::operation_aborted) {
                              self->set_state(State::kClosed);
                              self->impl_->stream.close();
                              return;
                            }
                            self->fail(400, "malformed HTTP request (" + ec.message() + ")");
                          });
}

void Connection::on_header() {
  const auto& h = impl_->parser->get();
  // Strict framing: the ambiguities that let a proxy and a server disagree about where a
  // request ends are refused outright.
  int content_lengths = 0;
  for (const auto& f : h)
    if (f.name() == http::field::content_length) ++content_lengths;
  if (content_lengths > 1) return fail(400, "the request has more than one Content-Length header");
  if (content_lengths == 1) {
    const auto v = h[http::field::content_length];
    if (v.empty() || v.find_first_not_of("0123456789") != beast::string_view::npos)
      return fail(400, "Content-Length must be a plain decimal number");
  }
  if (h.count(http::field::transfer_encoding) > 0) {
    std::string te(h[http::field::transfer_encoding]);
    for (char& c : te) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    while (!te.empty() && te.back() == ' ') te.pop_back();
    if (h.count(http::field::transfer_encoding) > 1 || te != "chunked")
      return fail(501, "Transfer-Encoding '" + std::string(h[http::field::transfer_encoding]) +
                           "' is not supported (only chunked)");
    if (content_lengths) return fail(400, "the request has both Content-Length and Transfer-Encoding");
  }
  const auto expect = h[http::field::expect];
  if (!expect.empty()) {
    if (!beast::iequals(expect, "100-continue")) return fail(417, "Expect: only 100-continue is supported");
    // curl sends this for bodies over 1 KiB and waits a second for the go-ahead.
    auto self = shared_from_this();
    impl_->canned = "HTTP/1.1 100 Continue\r\n\r\n";
    impl_->stream.expires_after(seconds(limits_.write_timeout_s));
    return net::async_write(impl_->stream, net::buffer(impl_->canned), [self](beast::error_code ec, size_t) {
      if (ec) {
        self->set_state(State::kClosed);
        return self->impl_->stream.close();
      }
      self->read_body();
    });
  }
  read_body();
}

void Connection::read_body() {
  set_state(State::kBody);
  arm_deadline(limits_.body_timeout_s);
  http::async_read(impl_->stream, impl_->buffer, *impl_->parser, [self = shared_from_this()](beast::error_code ec, size_t) {
    self->disarm_deadline();
    if (!ec) return self->on_body();
    if (self->impl_->timed_out)
      return self->fail(408, "the request body did not arrive within " + std::to_string(self->limits_.body_timeout_s) + " s");
    if (ec == http::error::body_limit)
      return self->fail(413, "the request body is larger than the server's limit of " +
                                 std::to_string(self->limits_.max_body_bytes) + " bytes (--max-request-bytes)");
    if (ec == http::error::end_of_stream || ec == net::error::eof || ec == net::error::connection_reset ||
        ec == http::error::partial_message) {
      self->set_state(State::kClosed);
      return self->impl_->stream.close();
    }
    self->fail(400, "malformed HTTP request body (" + ec.message() + ")");
  });
}

void Connection::on_body() {
  impl_->stream.expires_never();
  auto msg = impl_->parser->release();
  impl_->parser.reset();
  HttpRequest req;
  req.method = std::string(msg.method_string());
  req.target = std::string(msg.target());
  const size_t q = req.target.find('?');
  req.path = q == std::string::npos ? req.target : req.target.substr(0, q);
  for (const auto& f : msg) req.headers.emplace_back(std::string(f.name_string()), std::string(f.value()));
  req.body = std::move(msg.body());
  req.remote_addr = remote_addr_;
  req.remote_port = remote_port_;
  const DecodeResult d = decode_content(req.get_header_value("Content-Encoding"), req.body, limits_.max_body_bytes);
  if (d.status != 200) return fail(d.status, d.error);
  const bool keep_alive = msg.keep_alive();
  const int fd = fd_;
  req.client_gone = [fd] { return socket_peer_gone(fd); };
  set_state(State::kProcessing);
  owner_.on_request(shared_from_this(), std::move(req), keep_alive);
}

void Connection::fail(int status, const std::string& why) {
  owner_.on_rejected(remote_addr_ + ":" + std::to_string(remote_port_), status, why);
  const char* code = status == 413 ? "request_too_large" : status == 408 ? "request_timeout" : "bad_request";
  // Once the request line is read, an Anthropic route is answered in Anthropic's envelope.
  if (impl_->parser && impl_->parser->is_header_done()) {
    const std::string target(impl_->parser->get().target());
    if (is_anthropic_route(target.substr(0, target.find('?')))) {
      const ApiError e{status, why, "", "", code};
      return reject(anthropic_status(status), anthropic_error_json(e).dump());
    }
  }
  reject(status, envelope(status, why, code));
}

void Connection::reject(int status, const std::string& body, const std::string& extra_headers) {
  auto self = shared_from_this();
  net::dispatch(impl_->stream.get_executor(), [self, status, body, extra_headers] {
    if (self->state_ == State::kClosed) return;
    self->set_state(State::kProcessing);
    self->impl_->canned = "HTTP/1.1 " + std::to_string(status) + " " + reason_phrase(status) +
                          "\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
                          "\r\n" + extra_headers + "Connection: close\r\n\r\n" + body;
    self->impl_->stream.expires_after(seconds(self->limits_.write_timeout_s));
    net::async_write(self->impl_->stream, net::buffer(self->impl_->canned), [self](beast::error_code, size_t) {
      self->set_state(State::kClosed);
      boost::system::error_code ec;
      self->impl_->stream.socket().shutdown(tcp::socket::shutdown_send, ec);
      self->impl_->stream.close();
    });
  });
}

// ---- writing (worker thread) --------------------------------------------------------

bool Connection::write_all(std::string_view data, Clock::time_point deadline) {
  while (!data.empty()) {
    const ssize_t n = ::send(fd_, data.data(), data.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      data.remove_prefix(static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
      if (left <= 0) return false;  // the client stopped reading
      pollfd p{fd_, POLLOUT, 0};
      ::poll(&p, 1, static_cast<int>(std::min<long long>(left, 1000)));
      continue;
    }
    return false;  // reset, shut down, or closed
  }
  return true;
}

namespace {
const char* reason_phrase(int status) {
  switch (status) {
    case 200: return "OK";
    case 204: return "No Content";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 413: return "Content Too Large";
    case 415: return "Unsupported Media Type";
    case 417: return "Expectation Failed";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 499: return "Client Closed Request";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    case 529: return "Site Overloaded";  // Anthropic's overloaded_error
    default: return "Status";
  }
}
}  // namespace

std::string http_reason_phrase(int status) { return reason_phrase(status); }

}  // namespace moonrun::server
