#include "server/listen_backlog.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>

#include <algorithm>

namespace diffuse::server {
namespace {

int bound_port(int fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return -1;
  if (addr.ss_family == AF_INET) return ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  if (addr.ss_family == AF_INET6) return ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port);
  return -1;
}

}  // namespace

bool widen_listen_backlog(int port) {
  // The library keeps its socket private; descriptors are small integers, so look among them.
  rlimit limit{};
  const int max_fd = getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY
                         ? static_cast<int>(std::min<rlim_t>(limit.rlim_cur, 65536))
                         : 65536;
  bool found = false;
  for (int fd = 0; fd < max_fd; ++fd) {
    int listening = 0;
    socklen_t len = sizeof listening;
    if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) != 0 || !listening) continue;
    if (bound_port(fd) != port) continue;
    found = ::listen(fd, SOMAXCONN) == 0 || found;
  }
  return found;
}

}  // namespace diffuse::server
