#include "server/client_connection.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstdlib>

#include <httplib.h>

namespace moonrun::server {

namespace {

int port_of(const sockaddr_storage& addr) {
  if (addr.ss_family == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in&>(addr).sin_port);
  if (addr.ss_family == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6&>(addr).sin6_port);
  return -1;
}

// The address as httplib prints it into Request::remote_addr / local_addr.
bool host_of(const sockaddr_storage& addr, socklen_t len, std::string& host) {
  char buf[NI_MAXHOST] = {};
  if (getnameinfo(reinterpret_cast<const sockaddr*>(&addr), len, buf, sizeof buf, nullptr, 0,
                  NI_NUMERICHOST) != 0)
    return false;
  host = buf;
  return true;
}

// One side of socket fd (getsockname when local, else getpeername) equals host:port.
bool side_is(int fd, bool local, const std::string& host, int port) {
  sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  const int rc = local ? getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len)
                       : getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  if (rc != 0 || port_of(addr) != port) return false;  // not a connected TCP socket, or other port
  std::string h;
  return host_of(addr, len, h) && h == host;
}

}  // namespace

ClientConnection ClientConnection::of(const httplib::Request& req) {
  return find(req.local_addr, req.local_port, req.remote_addr, req.remote_port);
}

ClientConnection ClientConnection::find(const std::string& local_addr, int local_port,
                                        const std::string& remote_addr, int remote_port) {
  if (remote_port <= 0 || remote_addr.empty()) return ClientConnection();
  DIR* dir = opendir("/proc/self/fd");
  if (!dir) return ClientConnection();
  const int own = dirfd(dir);
  int match = -1, matches = 0;
  while (const dirent* e = readdir(dir)) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;  // "." and ".."
    const int fd = std::atoi(e->d_name);
    if (fd == own) continue;
    // The peer first: most fds are not connected sockets, and ports rule out the rest.
    if (!side_is(fd, /*local=*/false, remote_addr, remote_port)) continue;
    if (local_port > 0 && !side_is(fd, /*local=*/true, local_addr, local_port)) continue;
    match = fd;
    ++matches;
  }
  closedir(dir);
  // Two matches cannot happen for one live 4-tuple (only if local_addr was unknown and the
  // process also holds a client socket to the same peer): then nothing is known.
  return matches == 1 ? ClientConnection(match) : ClientConnection();
}

bool ClientConnection::gone() const {
  if (fd_ < 0) return false;
  pollfd p{fd_, POLLRDHUP, 0};
  const int rc = poll(&p, 1, 0);
  if (rc <= 0) return false;  // nothing yet (or EINTR: ask again next time)
  return (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
}

}  // namespace moonrun::server
