// socket_peer_gone() on real loopback TCP sockets: a closed, reset or half-closed peer is
// gone within a poll; a peer that sends a pipelined next request is not.
#include "server/client_connection.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

namespace moonrun::server {
namespace {

// A connected pair over 127.0.0.1: {server side, client side}.
struct Pair {
  int server = -1, client = -1;
  Pair() {
    int lst = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bind(lst, reinterpret_cast<sockaddr*>(&a), sizeof a);
    listen(lst, 1);
    socklen_t len = sizeof a;
    getsockname(lst, reinterpret_cast<sockaddr*>(&a), &len);
    client = socket(AF_INET, SOCK_STREAM, 0);
    connect(client, reinterpret_cast<sockaddr*>(&a), sizeof a);
    server = accept(lst, nullptr, nullptr);
    close(lst);
  }
  ~Pair() {
    if (server >= 0) close(server);
    if (client >= 0) close(client);
  }
};

bool gone_within(int fd, std::chrono::milliseconds ms) {
  const auto end = std::chrono::steady_clock::now() + ms;
  while (std::chrono::steady_clock::now() < end) {
    if (socket_peer_gone(fd)) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return false;
}

TEST(ClientConnection, AConnectedPeerIsNotGone) {
  Pair p;
  EXPECT_FALSE(socket_peer_gone(p.server));
}

TEST(ClientConnection, AClosedPeerIsGoneAtOnce) {
  Pair p;
  close(p.client);
  p.client = -1;
  EXPECT_TRUE(gone_within(p.server, std::chrono::milliseconds(200)));
}

TEST(ClientConnection, AResetPeerIsGone) {
  Pair p;
  linger l{1, 0};  // close() sends RST
  setsockopt(p.client, SOL_SOCKET, SO_LINGER, &l, sizeof l);
  close(p.client);
  p.client = -1;
  EXPECT_TRUE(gone_within(p.server, std::chrono::milliseconds(200)));
}

TEST(ClientConnection, AHalfClosedPeerCountsAsGone) {
  Pair p;
  shutdown(p.client, SHUT_WR);
  EXPECT_TRUE(gone_within(p.server, std::chrono::milliseconds(200)));
}

TEST(ClientConnection, APipelinedNextRequestIsNotADisconnect) {
  Pair p;
  const char next[] = "GET /health HTTP/1.1\r\nHost: x\r\n\r\n";
  ASSERT_EQ(send(p.client, next, sizeof next - 1, 0), static_cast<ssize_t>(sizeof next - 1));
  EXPECT_FALSE(gone_within(p.server, std::chrono::milliseconds(50)));
}

TEST(ClientConnection, AnInvalidDescriptorIsNeverGone) { EXPECT_FALSE(socket_peer_gone(-1)); }

}  // namespace
}  // namespace moonrun::server
