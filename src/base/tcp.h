// Socket options the listeners share.
#pragma once

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

namespace weir {

// TCP keep-alive on an accepted connection: a peer gone without a FIN or RST
// (its host lost, a NAT that dropped the mapping) is found after about
// idle + interval * count seconds (2 min by default) instead of never, which
// matters for connections that may stay quiet for good (an HTTP/2 append
// session between inputs). Kafka's broker enables keep-alive too. Best
// effort: a failing option leaves the socket as it was.
inline void EnableTcpKeepAlive(int fd, int idle_s = 60, int interval_s = 10, int count = 6) {
  int one = 1;
  if (setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one) != 0) return;
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle_s, sizeof idle_s);
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval_s, sizeof interval_s);
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof count);
}

// The address to use of a getaddrinfo list: its first IPv4 one, else its
// first. glibc may list ::1 first for localhost, where servers (and clients)
// default to 127.0.0.1.
inline const addrinfo* PreferIPv4(const addrinfo* found) {
  for (const addrinfo* ai = found; ai != nullptr; ai = ai->ai_next) {
    if (ai->ai_family == AF_INET) return ai;
  }
  return found;
}

}  // namespace weir
