#include "common/network.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string_view>

#include "common/fd.h"

namespace trainrun {

std::string host_name() {
  char name[256] = {0};
  ::gethostname(name, sizeof(name) - 1);
  return name;
}

std::optional<TcpEndpoint> parse_tcp_endpoint(const std::string& endpoint) {
  constexpr std::string_view kScheme = "tcp://";
  if (endpoint.rfind(kScheme, 0) != 0) return std::nullopt;
  auto colon = endpoint.rfind(':');
  if (colon == std::string::npos || colon <= kScheme.size() || colon + 1 == endpoint.size()) {
    return std::nullopt;
  }
  TcpEndpoint parsed{endpoint.substr(kScheme.size(), colon - kScheme.size()),
                     endpoint.substr(colon + 1)};
  auto& host = parsed.host;
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  return parsed;
}

std::optional<std::string> local_address_towards(const std::string& endpoint) {
  auto tcp = parse_tcp_endpoint(endpoint);
  if (!tcp) return std::nullopt;
  addrinfo hints{};
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(tcp->host.c_str(), tcp->port.c_str(), &hints, &found) != 0) {
    return std::nullopt;
  }
  std::optional<std::string> local;
  for (auto* ai = found; ai != nullptr && !local; ai = ai->ai_next) {
    Fd fd(::socket(ai->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0));
    if (!fd) continue;
    sockaddr_storage address{};
    socklen_t length = sizeof(address);
    if (::connect(fd.get(), ai->ai_addr, ai->ai_addrlen) == 0 &&
        ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&address), &length) == 0) {
      char text[INET6_ADDRSTRLEN] = {0};
      const void* raw =
          address.ss_family == AF_INET
              ? static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(&address)->sin_addr)
              : static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(&address)->sin6_addr);
      if (::inet_ntop(address.ss_family, raw, text, sizeof(text)) != nullptr) local = text;
    }
  }
  ::freeaddrinfo(found);
  return local;
}

}  // namespace trainrun
