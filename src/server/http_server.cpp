#include "server/http_server.h"

#include <malloc.h>
#include <sys/resource.h>

#include <boost/asio.hpp>

#include <algorithm>
#include <cstdio>
#include <mutex>
#include <random>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "common/log.h"
#include "server/anthropic_error.h"
#include "server/client_connection.h"
#include "server/generation.h"
#include "server/handlers.h"
#include "server/routes.h"
#include "server/worker_pool.h"

namespace moonrun::server {

namespace net = boost::asio;
using tcp = net::ip::tcp;
using Clock = std::chrono::steady_clock;

namespace {

// An answer (or request body) over this many bytes is followed by malloc_trim: the JSON
// tree behind it runs 5-15 times its text, so 64 KiB of text is about a megabyte of freed
// tree; smaller ones are the common case and leave little behind.
constexpr size_t kTrimAfterBytes = 64 * 1024;

// Lets the process hold as many sockets as the hard limit allows (often 1024 soft).
int raise_fd_limit() {
  rlimit rl{};
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return 1024;
  if (rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
    getrlimit(RLIMIT_NOFILE, &rl);
  }
  return rl.rlim_cur == RLIM_INFINITY ? 1 << 20 : static_cast<int>(std::min<rlim_t>(rl.rlim_cur, 1 << 20));
}

bool sane_request_id(const std::string& id) {
  if (id.empty() || id.size() > 128) return false;
  for (char c : id)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.' || c == ':')) return false;
  return true;
}

std::string new_request_id() {
  static std::atomic<uint64_t> counter{0};
  static const uint64_t salt = std::random_device{}();
  char buf[40];
  std::snprintf(buf, sizeof buf, "req-%06llx%06llx", static_cast<unsigned long long>(salt & 0xffffff),
                static_cast<unsigned long long>(++counter));
  return buf;
}

std::string fmt_s(double s) {
  if (s < 0) return "-";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f", s);
  return buf;
}

// One SSE response on the wire: each write() is one HTTP chunk, bounded by the write timeout.
class StreamSink : public ChunkSink {
 public:
  StreamSink(Connection& conn, double write_timeout_s) : conn_(conn), timeout_(write_timeout_s) {}
  bool write(std::string_view data) override {
    if (!ok_) return false;
    if (data.empty()) return true;
    char head[24];
    const int n = std::snprintf(head, sizeof head, "%zx\r\n", data.size());
    std::string frame;
    frame.reserve(data.size() + n + 2);
    frame.append(head, n).append(data).append("\r\n");
    ok_ = conn_.write_all(frame, deadline());
    bytes_ += data.size();
    return ok_;
  }
  size_t bytes() const { return bytes_; }
  bool is_writable() override { return ok_ && !conn_.gone(); }
  bool finish() { return ok_ && (ok_ = conn_.write_all("0\r\n\r\n", deadline())); }
  bool ok() const { return ok_; }

 private:
  Clock::time_point deadline() const {
    return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_));
  }
  Connection& conn_;
  double timeout_;
  bool ok_ = true;
  size_t bytes_ = 0;
};

}  // namespace

struct HttpServer::Impl : ConnectionOwner {
  explicit Impl(const ServingContext& c) : ctx(c) {
    const ServeOptions& o = ctx.options;
    limits.max_body_bytes = o.max_request_bytes;
    limits.idle_timeout_s = o.idle_timeout_s;
    limits.header_timeout_s = o.header_timeout_s;
    limits.body_timeout_s = o.body_timeout_s;
    limits.write_timeout_s = o.write_timeout_s;
    // Memory per request stays bounded: blocks of 1 MiB and more (an answer's JSON text,
    // logprob arrays) are mmap'ed and go back to the OS when freed; glibc would otherwise
    // raise this threshold after the first large free and keep such blocks in its arenas.
    // Fewer arenas than glibc's 8 per core keep what the worker threads' small blocks
    // fragment to a few, without measurable contention (the engine thread does the work).
    mallopt(M_MMAP_THRESHOLD, 1 << 20);
    mallopt(M_ARENA_MAX, 4);
    const int fd_limit = raise_fd_limit();
    max_connections = std::max(8, std::min(o.max_connections, fd_limit - 64));
    if (max_connections < o.max_connections)
      MR_LOG(WARNING) << "--max-connections " << o.max_connections << " is above what the open-file limit allows; using "
                      << max_connections << " (raise `ulimit -n`)";
    const int threads = o.http_threads > 0 ? o.http_threads
                                           : std::max(64, std::max(o.max_running_requests, 64) + o.max_queued_requests + 64);
    pool = std::make_unique<WorkerPool>(static_cast<size_t>(threads));
  }

  // ---- ConnectionOwner (event-loop threads) ----
  void on_request(std::shared_ptr<Connection> conn, HttpRequest req, bool keep_alive) override {
    const std::string given = req.get_header_value("X-Request-Id");
    req.request_id = sane_request_id(given) ? given : new_request_id();
    MR_LOG(DEBUG) << "request " << req.request_id << " " << req.method << " " << req.target << " from "
                  << req.remote_addr << ":" << req.remote_port << " (" << req.body.size() << " body bytes)";
    const std::string path = req.path;
    auto task = [this, conn, req = std::move(req), keep_alive]() mutable {
      process(std::move(conn), std::move(req), keep_alive);
    };
    if (!pool->try_submit(std::move(task))) {
      if (ctx.metrics) ctx.metrics->response_sent(503);
      MR_LOG(WARNING) << "every one of the " << pool->max_threads()
                      << " request threads is busy; answering 503 (raise --http-threads)";
      const ApiError busy = overloaded("The server is at its limit of concurrent requests; retry shortly.");
      if (is_anthropic_route(path)) conn->reject(529, anthropic_error_json(busy).dump(), "Retry-After: 1\r\n");
      else conn->reject(503, busy.to_json().dump(), "Retry-After: 1\r\n");
    }
  }
  void on_rejected(const std::string& remote, int status, const std::string& why) override {
    if (ctx.metrics) ctx.metrics->response_sent(status);
    MR_LOG(INFO) << "refused a request from " << remote << ": " << status << " " << why;
  }
  void on_destroyed(Connection* conn) override {
    std::lock_guard<std::mutex> lock(conns_mu);
    conns.erase(conn);
  }
  bool draining() const override { return draining_flag; }

  // ---- accepting ----
  void do_accept() {
    acceptor->async_accept(net::make_strand(ioc), [this](boost::system::error_code ec, tcp::socket sock) {
      if (!accepting) return;
      if (ec) {
        // EMFILE/ENFILE: out of descriptors; back off briefly instead of spinning.
        MR_LOG(WARNING) << "accept failed: " << ec.message();
        auto timer = std::make_shared<net::steady_timer>(ioc, std::chrono::milliseconds(100));
        timer->async_wait([this, timer](boost::system::error_code) {
          if (accepting) do_accept();
        });
        return;
      }
      admit(std::move(sock));
      do_accept();
    });
  }

  void admit(tcp::socket sock) {
    std::shared_ptr<Connection> conn = Connection::create(&sock, limits, *this);
    std::shared_ptr<Connection> victim;
    bool over = false;
    {
      std::vector<std::shared_ptr<Connection>> held;  // released after the lock
      std::lock_guard<std::mutex> lock(conns_mu);
      if (static_cast<int>(conns.size()) >= max_connections) {
        // Make room by closing the connection that has waited longest without giving us a
        // whole request (idle keep-alive, or trickling headers): slow clients yield to new ones.
        Clock::time_point oldest = Clock::time_point::max();
        for (auto& [ptr, weak] : conns) {
          auto c = weak.lock();
          if (!c) continue;
          held.push_back(c);
          const auto st = c->state();
          if ((st == Connection::State::kIdle || st == Connection::State::kHeader) && c->state_since() < oldest) {
            oldest = c->state_since();
            victim = c;
          }
        }
        over = !victim;
      }
      conns[conn.get()] = conn;
      held.clear();
    }
    MR_LOG(TRACE) << "accepted " << conn->remote_addr() << ":" << conn->remote_port();
    if (victim) {
      MR_LOG(DEBUG) << "connection limit (" << max_connections << ") reached: closing the longest-waiting connection "
                    << victim->remote_addr() << ":" << victim->remote_port();
      victim->close();
    }
    if (over) {
      if (ctx.metrics) ctx.metrics->response_sent(503);
      conn->reject(503, overloaded("The server has reached --max-connections; retry shortly.").to_json().dump(),
                   "Retry-After: 1\r\n");
      return;
    }
    conn->start();
  }

  std::vector<std::shared_ptr<Connection>> connections() {
    std::vector<std::shared_ptr<Connection>> out;
    std::lock_guard<std::mutex> lock(conns_mu);
    for (auto& [ptr, weak] : conns)
      if (auto c = weak.lock()) out.push_back(std::move(c));
    return out;  // destroyed by the caller, outside the lock
  }

  // ---- answering (worker threads) ----
  void process(std::shared_ptr<Connection> conn, HttpRequest req, bool keep_alive) {
    RequestRecord record;
    record.id = req.request_id;
    {
      std::lock_guard<std::mutex> lock(inflight_mu);
      inflight.insert(&record);
      if (cutting) record.cut = true;
    }
    int status = 0;
    std::string error_message;  // a refused request's reason, for its log line
    bool written = false;
    size_t bytes_out = 0;
    {
      HttpResponse res;
      {
        ScopedCurrentRequest scope(&record);
        try {
          route_request(ctx, req, res, draining_flag);
        } catch (const nlohmann::json::exception& e) {
          res = HttpResponse();
          send_error(res, bad_request(json_exception_message(e)));
        } catch (const std::exception& e) {
          MR_LOG(ERROR) << "request " << record.id << " handler failed: " << e.what();
          res = HttpResponse();
          send_error(res, internal(std::string("Internal server error: ") + e.what()));
        }
        if (draining_flag) keep_alive = false;
        status = res.status;
        bytes_out = res.body.size();
        if (status >= 400 && !res.stream) error_message = error_message_of(res.body);
        written = write_response(*conn, req, res, keep_alive, bytes_out);
      }
    }  // the response (and any Generation it holds) dies before the record
    {
      std::lock_guard<std::mutex> lock(inflight_mu);
      inflight.erase(&record);
    }
    if (ctx.metrics) ctx.metrics->response_sent(status);
    log_request(req, record, status, written, error_message);
    // A large answer leaves freed memory in this thread's malloc arena, which glibc keeps:
    // without this, RSS ratchets up by the largest answer each arena ever built. What
    // counts is the JSON tree the answer was built from, not its text: a 2,000-token chat
    // answer with top_logprobs 5 is under 1 MB of text but about 14 MB of tree, so the
    // bar is the text a tree of a few MB makes (kTrimAfterBytes).
    if (bytes_out > kTrimAfterBytes || req.body.size() > kTrimAfterBytes) malloc_trim(0);
    conn->release(written && keep_alive && !draining_flag);
  }

  bool write_response(Connection& conn, const HttpRequest& req, HttpResponse& res, bool keep_alive,
                      size_t& bytes_out) {
    std::string head = "HTTP/1.1 " + std::to_string(res.status) + " " + http_reason_phrase(res.status) + "\r\n";
    if (!res.body.empty() || res.stream) head += "Content-Type: " + res.content_type + "\r\n";
    for (const auto& [k, v] : res.headers) head += k + ": " + v + "\r\n";
    head += "X-Request-Id: " + req.request_id + "\r\n";
    head += keep_alive ? "Connection: keep-alive\r\n" : "Connection: close\r\n";
    const double timeout = limits.write_timeout_s;
    if (!res.stream) {
      head += "Content-Length: " + std::to_string(res.body.size()) + "\r\n\r\n";
      // Small answers must go out within the write timeout; big ones get time for their size
      // at 1 MB/s, so a client that reads nothing holds this thread for a bounded time.
      const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                               std::chrono::duration<double>(timeout + res.body.size() / 1e6));
      if (req.method == "HEAD") return conn.write_all(head, deadline);
      head += res.body;
      std::string().swap(res.body);
      return conn.write_all(head, deadline);
    }
    head += "Transfer-Encoding: chunked\r\n\r\n";
    StreamSink sink(conn, timeout);
    if (!conn.write_all(head, Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout))))
      return false;
    res.stream(sink);
    bytes_out = sink.bytes();
    return sink.finish();
  }

  // The message of an OpenAI (or Anthropic) error envelope, cut to a log line's worth.
  static std::string error_message_of(const std::string& body) {
    if (body.empty() || body.size() > (64u << 10)) return "";
    const auto j = nlohmann::json::parse(body, nullptr, false);
    if (!j.is_object()) return "";
    auto e = j.find("error");
    if (e == j.end() || !e->is_object()) return "";
    auto m = e->find("message");
    if (m == e->end() || !m->is_string()) return "";
    std::string s = m->get<std::string>();
    if (s.size() > 400) s = s.substr(0, 400) + "...";
    return s;
  }

  void log_request(const HttpRequest& req, RequestRecord& rec, int status, bool written,
                   const std::string& error_message) {
    const bool quiet = req.path == "/health" || req.path == "/metrics" || !ctx.options.log_requests;
    const LogLevel level = quiet ? LogLevel::DEBUG : LogLevel::INFO;
    if (!log_enabled(level)) return;
    std::lock_guard<std::mutex> lock(rec.mu);
    std::vector<LogField> f;
    f.push_back({"id", rec.id, true});
    f.push_back({"route", req.method + " " + req.path, true});
    f.push_back({"status", std::to_string(status), false});
    if (rec.prompt_tokens >= 0) f.push_back({"prompt_tokens", std::to_string(rec.prompt_tokens), false});
    if (rec.completion_tokens >= 0) f.push_back({"completion_tokens", std::to_string(rec.completion_tokens), false});
    if (rec.queue_s >= 0) f.push_back({"queue_s", fmt_s(rec.queue_s), false});
    if (rec.ttft_s >= 0) f.push_back({"ttft_s", fmt_s(rec.ttft_s), false});
    if (rec.spec_steps > 0) {
      // vLLM's mean acceptance length: tokens a verify step yields, the model's own one included.
      char len[32];
      std::snprintf(len, sizeof len, "%.2f", 1.0 + static_cast<double>(rec.spec_accepted_tokens) / rec.spec_steps);
      f.push_back({"spec_accept_len", len, false});
      f.push_back({"spec_accepted", std::to_string(rec.spec_accepted_tokens) + "/" + std::to_string(rec.spec_draft_tokens), false});
    }
    f.push_back({"total_s", fmt_s(std::chrono::duration<double>(Clock::now() - rec.arrival).count()), false});
    f.push_back({"client", req.remote_addr + ":" + std::to_string(req.remote_port), true});
    if (!written) f.push_back({"note", "client gone before the answer was written", true});
    // Why a request was refused, so an operator need not reproduce it (escaped like every field).
    if (!error_message.empty()) f.push_back({"error", error_message, true});
    log_record(level, "request", f);
  }

  const ServingContext& ctx;
  HttpLimits limits;
  int max_connections = 4096;
  int port = 0;
  std::atomic<bool> draining_flag{false}, accepting{true};

  std::mutex conns_mu;  // declared before ioc: connections die with it and unregister here
  std::unordered_map<Connection*, std::weak_ptr<Connection>> conns;
  mutable std::mutex inflight_mu;
  std::unordered_set<RequestRecord*> inflight;
  bool cutting = false;

  net::io_context ioc;
  std::unique_ptr<tcp::acceptor> acceptor;
  std::vector<std::thread> io_threads;
  std::unique_ptr<WorkerPool> pool;  // last: its threads use everything above
};

HttpServer::HttpServer(const ServingContext& ctx) : impl_(std::make_unique<Impl>(ctx)) {}

HttpServer::~HttpServer() {
  stop();
  impl_->pool.reset();  // waits for requests still being answered
}

int HttpServer::port() const { return impl_->port; }
int HttpServer::in_flight() const {
  std::lock_guard<std::mutex> lock(impl_->inflight_mu);
  return static_cast<int>(impl_->inflight.size());
}
int HttpServer::open_connections() const {
  std::lock_guard<std::mutex> lock(impl_->conns_mu);
  return static_cast<int>(impl_->conns.size());
}
void HttpServer::set_draining(bool draining) { impl_->draining_flag = draining; }

Status HttpServer::bind() {
  const ServeOptions& o = impl_->ctx.options;
  boost::system::error_code ec;
  tcp::endpoint ep;
  auto addr = net::ip::make_address(o.host, ec);
  if (!ec) {
    ep = tcp::endpoint(addr, static_cast<unsigned short>(o.port));
  } else {  // a name ("localhost", this machine's hostname): its first address
    tcp::resolver resolver(impl_->ioc);
    auto found = resolver.resolve(o.host, std::to_string(o.port), tcp::resolver::passive, ec);
    if (ec || found.empty()) return invalid_argument("--host " + o.host + ": not an address this machine has (" + ec.message() + ")");
    ep = found.begin()->endpoint();
  }
  auto acc = std::make_unique<tcp::acceptor>(impl_->ioc);
  acc->open(ep.protocol(), ec);
  if (!ec) acc->set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) acc->bind(ep, ec);
  if (!ec) acc->listen(std::max(16, o.backlog), ec);
  if (ec)
    return unavailable("cannot listen on " + o.host + ":" + std::to_string(o.port) + " (" + ec.message() + ")");
  impl_->port = acc->local_endpoint().port();
  impl_->acceptor = std::move(acc);
  return Status::ok();
}

void HttpServer::serve() {
  if (!impl_->acceptor) return;
  impl_->do_accept();
  const int n = std::max(1, impl_->ctx.options.io_threads);
  for (int i = 1; i < n; ++i) impl_->io_threads.emplace_back([this] { impl_->ioc.run(); });
  impl_->ioc.run();
  for (auto& t : impl_->io_threads) t.join();
  impl_->io_threads.clear();
}

void HttpServer::stop() {
  impl_->accepting = false;
  for (auto& c : impl_->connections()) c->shutdown_socket();
  impl_->ioc.stop();
}

int HttpServer::shutdown(std::chrono::duration<double> timeout) {
  Impl& s = *impl_;
  const auto start = Clock::now();
  const auto deadline = start + std::chrono::duration_cast<Clock::duration>(timeout);
  s.draining_flag = true;
  s.accepting = false;
  net::post(s.ioc, [&s] {
    boost::system::error_code ec;
    if (s.acceptor) s.acceptor->close(ec);  // new connections are refused by the kernel
  });
  // Idle keep-alive connections carry nothing: close them now.
  for (auto& c : s.connections())
    if (c->state() == Connection::State::kIdle) c->close();
  while (Clock::now() < deadline && in_flight() > 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  int cut = 0;
  {
    std::lock_guard<std::mutex> lock(s.inflight_mu);
    s.cutting = true;
    for (RequestRecord* r : s.inflight) {
      r->cut_all();
      ++cut;
    }
  }
  if (cut > 0) {
    MR_LOG(WARNING) << "--shutdown-timeout passed with " << cut
                    << " request(s) still running: cut them (streams get an error event and [DONE], others 503)";
    // Their answers are short now: a second to write them.
    const auto grace = Clock::now() + std::chrono::seconds(1);
    while (Clock::now() < grace && in_flight() > 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  // Whatever is left is blocked on a client that does not read: make its writes fail.
  for (auto& c : s.connections()) c->shutdown_socket();
  const auto last = Clock::now() + std::chrono::milliseconds(500);
  while (Clock::now() < last && in_flight() > 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  stop();
  return cut;
}

}  // namespace moonrun::server
