// ClientConnection against a real cpp-httplib server on loopback and raw client sockets:
// a handler finds its own connection from the Request, sees a closed or reset client as gone
// within a poll, and does not mistake a pipelined next request (keep-alive) for a disconnect.
#include "server/client_connection.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <httplib.h>

#include <atomic>
#include <chrono>
#include <future>
#include <string>
#include <thread>

namespace moonrun::server {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// What the handler saw while it waited for its client (up to `wait`, polling every 5 ms).
struct Seen {
  bool found = false;
  bool gone = false;
  double gone_after_s = -1;  // since the handler started
};

class LoopbackServer {
 public:
  explicit LoopbackServer(std::chrono::milliseconds wait) {
    server_.Post("/wait", [this, wait](const httplib::Request& req, httplib::Response& res) {
      const auto start = Clock::now();
      const ClientConnection conn = ClientConnection::of(req);
      Seen s;
      s.found = conn.found();
      while (Clock::now() - start < wait) {
        if (conn.gone()) {
          s.gone = true;
          s.gone_after_s = std::chrono::duration<double>(Clock::now() - start).count();
          break;
        }
        std::this_thread::sleep_for(5ms);
      }
      {
        std::lock_guard<std::mutex> lock(mu_);
        seen_.push_back(s);
      }
      entered_.fetch_add(1);
      res.set_content(s.gone ? "gone" : "here", "text/plain");
    });
    port_ = server_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    while (!server_.is_running()) std::this_thread::sleep_for(1ms);
  }
  ~LoopbackServer() {
    server_.stop();
    thread_.join();
  }
  int port() const { return port_; }
  // Waits until n handlers finished; their observations in order.
  std::vector<Seen> seen(size_t n) {
    for (int i = 0; i < 1000 && entered_.load() < static_cast<int>(n); ++i) std::this_thread::sleep_for(5ms);
    std::lock_guard<std::mutex> lock(mu_);
    return seen_;
  }

 private:
  httplib::Server server_;
  std::thread thread_;
  int port_ = 0;
  std::mutex mu_;
  std::vector<Seen> seen_;
  std::atomic<int> entered_{0};
};

int connect_to(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  return fd;
}

void send_all(int fd, const std::string& s) {
  ASSERT_EQ(send(fd, s.data(), s.size(), MSG_NOSIGNAL), static_cast<ssize_t>(s.size()));
}

std::string read_all(int fd) {
  std::string out;
  char buf[4096];
  for (;;) {
    ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

const std::string kRequest = "POST /wait HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}";

TEST(ClientConnection, HandlerFindsItsSocketAndSeesAClosedClientAtOnce) {
  LoopbackServer server(3000ms);
  int fd = connect_to(server.port());
  send_all(fd, kRequest);
  std::this_thread::sleep_for(100ms);  // the handler is waiting now
  close(fd);
  auto seen = server.seen(1);
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_TRUE(seen[0].found);
  EXPECT_TRUE(seen[0].gone);
  // Closed after ~100 ms; the handler polls every 5 ms. 1 s of slack for a loaded CI box.
  EXPECT_LT(seen[0].gone_after_s, 1.1);
}

TEST(ClientConnection, AResetClientIsGone) {
  LoopbackServer server(3000ms);
  int fd = connect_to(server.port());
  linger lg{1, 0};  // close() sends RST instead of FIN
  ASSERT_EQ(setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg), 0);
  send_all(fd, kRequest);
  std::this_thread::sleep_for(100ms);
  close(fd);
  auto seen = server.seen(1);
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_TRUE(seen[0].found);
  EXPECT_TRUE(seen[0].gone);
  EXPECT_LT(seen[0].gone_after_s, 1.1);
}

// A half-close (shutdown(SHUT_WR)) is a FIN like close(): counted as gone (see the header).
TEST(ClientConnection, AHalfClosedClientCountsAsGone) {
  LoopbackServer server(3000ms);
  int fd = connect_to(server.port());
  send_all(fd, kRequest);
  std::this_thread::sleep_for(100ms);
  ASSERT_EQ(shutdown(fd, SHUT_WR), 0);
  read_all(fd);  // httplib 0.11.4 sends it nothing (its own write check sees the EOF)
  close(fd);
  auto seen = server.seen(1);
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_TRUE(seen[0].found);
  EXPECT_TRUE(seen[0].gone);
  EXPECT_LT(seen[0].gone_after_s, 1.1);
}

// Keep-alive: the next request sent while the first is still being answered is data on the
// socket, not a disconnect. Both answers come back, neither handler saw "gone". (httplib
// 0.11.4 reads each request through a fresh buffer, so requests written in one burst are
// lost after the first; a client that sends the next one mid-answer is what can happen.)
TEST(ClientConnection, ANextRequestOnAKeepAliveConnectionIsNotADisconnect) {
  LoopbackServer server(300ms);
  int fd = connect_to(server.port());
  send_all(fd, kRequest);
  std::this_thread::sleep_for(100ms);  // the first handler is waiting now
  send_all(fd, "POST /wait HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 2\r\n\r\n{}");
  const std::string replies = read_all(fd);
  close(fd);
  auto seen = server.seen(2);
  ASSERT_EQ(seen.size(), 2u) << replies;
  for (const Seen& s : seen) {
    EXPECT_TRUE(s.found);
    EXPECT_FALSE(s.gone);
  }
  size_t n = 0;
  for (size_t at = replies.find("HTTP/1.1 200"); at != std::string::npos; at = replies.find("HTTP/1.1 200", at + 1)) ++n;
  EXPECT_EQ(n, 2u) << replies;
  EXPECT_EQ(replies.find("gone"), std::string::npos) << replies;
}

TEST(ClientConnection, AnUnknownPeerIsNotFoundAndNeverGone) {
  ClientConnection c = ClientConnection::find("127.0.0.1", 1, "127.0.0.1", 1);
  EXPECT_FALSE(c.found());
  EXPECT_FALSE(c.gone());
  EXPECT_FALSE(ClientConnection::find("", -1, "", -1).found());
}

}  // namespace
}  // namespace moonrun::server
