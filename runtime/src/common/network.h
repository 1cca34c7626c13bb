#pragma once

// Addresses on this host.

#include <optional>
#include <string>

namespace trainrun {

struct TcpEndpoint {
  std::string host;  // an IPv6 address without its brackets
  std::string port;
};

/// This host's name, as workers and agents tell the controller (ranks are
/// grouped by it).
std::string host_name();

/// The host and port of "tcp://HOST:PORT" ("tcp://[::1]:PORT" for IPv6), or
/// none for another kind of endpoint or one without both.
std::optional<TcpEndpoint> parse_tcp_endpoint(const std::string& endpoint);

/// The local address this host uses to reach a "tcp://HOST:PORT" endpoint (the
/// kernel's route choice; nothing is sent), or none for another kind of
/// endpoint or a host that does not resolve.
std::optional<std::string> local_address_towards(const std::string& endpoint);

}  // namespace trainrun
