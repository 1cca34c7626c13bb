#pragma once

// Addresses on this host.

#include <optional>
#include <string>

namespace trainrun {

/// The local address this host uses to reach a "tcp://HOST:PORT" endpoint (the
/// kernel's route choice; nothing is sent), or none for another kind of
/// endpoint or a host that does not resolve.
std::optional<std::string> local_address_towards(const std::string& endpoint);

}  // namespace trainrun
