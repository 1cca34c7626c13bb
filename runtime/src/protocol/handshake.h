#pragma once

// A peer's first word with the controller is ZeroMQ's handshake (CURVE with a
// run key): a node agent waits for it before it starts any worker, so that a
// wrong key costs nothing and is said at once, not after the startup timeout.

#include <zmq.hpp>

#include <chrono>
#include <optional>
#include <string>

namespace trainrun::protocol {

class HandshakeWatch {
 public:
  enum class Outcome { kDone, kRefused, kMismatch, kTimedOut, kInterrupted };

  /// Watches `socket`'s handshakes; made before the socket connects.
  HandshakeWatch(zmq::context_t& context, zmq::socket_t& socket);
  ~HandshakeWatch();
  HandshakeWatch(const HandshakeWatch&) = delete;
  HandshakeWatch& operator=(const HandshakeWatch&) = delete;

  /// Waits up to `timeout` for a handshake to succeed. kRefused: the
  /// controller's ZAP handler refused the key; kMismatch: three handshakes in
  /// a row ended without a word (a key the controller cannot read, or security
  /// that differs: one side with a run key, the other without). Returns
  /// kInterrupted when `interrupt_fd` becomes readable (-1: none); it is not read.
  Outcome wait(std::chrono::milliseconds timeout, int interrupt_fd);

  /// One line for an outcome other than kDone, naming the controller's endpoint.
  static std::string describe(Outcome outcome, const std::string& endpoint, bool keyed,
                              std::chrono::milliseconds timeout);

 private:
  zmq::socket_t& socket_;
  std::optional<zmq::socket_t> events_;
};

}  // namespace trainrun::protocol
