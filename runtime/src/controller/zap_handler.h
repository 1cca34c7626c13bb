#pragma once

// The controller's ZAP handler (ZeroMQ's authentication protocol, RFC 27):
// libzmq asks it about every peer that completes a handshake on the
// controller's sockets. A CURVE peer must present the workers' public key,
// derived from the run key (common/run_key.h); a peer on the local Unix socket
// (NULL mechanism) is let through, its HELLO carries the run's worker secret.
// Answered on the controller's thread, polled with its other sockets.

#include <zmq.hpp>

#include <optional>
#include <string>

#include "common/run_key.h"

namespace trainrun {

class ZapHandler {
 public:
  /// Binds inproc://zeromq.zap.01 in `context`; must come before the sockets
  /// it guards bind.
  ZapHandler(zmq::context_t& context, const RunKeys& keys);

  zmq::socket_t& socket() { return socket_; }
  /// Answers one waiting request; returns the peer's address when it was
  /// refused (for a log line), none when it was let through or nothing waited.
  std::optional<std::string> answer();

 private:
  zmq::socket_t socket_;
  std::string client_key_;  // the 32 bytes the workers present
};

}  // namespace trainrun
