// Helpers shared by the tests that drive a server over raw loopback sockets
// (kafka_tcp_test, http_server_test). Header-only; no weir dependencies.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

namespace weir::testing {

// Polls `done` every 10 ms for up to 60 s (a bound, not a timing check).
template <typename F>
bool WaitUntil(F done) {
  for (int i = 0; i < 6000; ++i) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return done();
}

// A blocking TCP connection to "ip:port" (IPv4); -1 on failure.
inline int Connect(const std::string& addr) {
  const size_t colon = addr.rfind(':');
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(std::stoi(addr.substr(colon + 1))));
  ::inet_pton(AF_INET, addr.substr(0, colon).c_str(), &sa.sin_addr);
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd >= 0 && ::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

inline bool SendAll(int fd, const std::string& bytes) {
  size_t off = 0;
  while (off < bytes.size()) {
    ssize_t w = ::send(fd, bytes.data() + off, bytes.size() - off, MSG_NOSIGNAL);
    if (w <= 0) return false;
    off += static_cast<size_t>(w);
  }
  return true;
}

// True if the peer closed the connection (EOF or reset) within the timeout.
inline bool ClosedByPeer(int fd, int timeout_ms = 10000) {
  pollfd p{fd, POLLIN, 0};
  if (::poll(&p, 1, timeout_ms) <= 0) return false;
  char c;
  return ::recv(fd, &c, 1, 0) <= 0;
}

// Whether the server's end of the loopback connection `fd` (IPv4) has its
// TCP keep-alive timer running, as /proc/net/tcp shows it (timer 2) on an
// idle connection; polled for up to 10 s (the server sets it after accept).
inline bool ServerSideKeepsAlive(int fd) {
  sockaddr_in local{}, peer{};
  socklen_t n = sizeof local, m = sizeof peer;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &n) != 0 ||
      ::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &m) != 0) {
    return false;
  }
  char want[64];  // the server's line: local = the server, remote = us
  std::snprintf(want, sizeof want, "%08X:%04X %08X:%04X", peer.sin_addr.s_addr, ntohs(peer.sin_port),
                local.sin_addr.s_addr, ntohs(local.sin_port));
  return WaitUntil([&] {
    std::ifstream in("/proc/net/tcp");
    for (std::string line; std::getline(in, line);) {
      const size_t at = line.find(want);
      if (at == std::string::npos) continue;
      // sl local rem st tx:rx tr:when ...
      std::istringstream fields(line.substr(at));
      std::string loc, rem, st, queues, timer;
      fields >> loc >> rem >> st >> queues >> timer;
      return timer.starts_with("02:");
    }
    return false;
  });
}

}  // namespace weir::testing
