#pragma once

// Messages for fuzzing the controller's socket: for every type of the
// protocol, a valid sample, mutated at random in one of several ways, some
// aware of the message's structure (a field's value replaced by one of another
// type, a field dropped or added, text that is not UTF-8, nesting without end)
// and some blind (flipped bits, cut or padded bodies, a declared length far
// past the data, broken type frames, missing or extra frames). Seeded, so a
// failure can be replayed. Not thread-safe.

#include <zmq.hpp>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace trainrun::fuzz {

class MessageMutator {
 public:
  explicit MessageMutator(uint64_t seed);

  /// Every message type of the protocol, in both directions.
  static const std::vector<std::string>& types();

  /// One message (type frame, body, blobs) of a random type, mutated; now and
  /// then left valid.
  std::vector<zmq::message_t> next();
  std::vector<zmq::message_t> next(const std::string& type);

  std::mt19937_64& random() { return random_; }

 private:
  std::string random_bytes(size_t max);
  size_t below(size_t n) { return std::uniform_int_distribution<size_t>(0, n - 1)(random_); }

  std::mt19937_64 random_;
};

/// Sends one message's frames without blocking; a message that finds the
/// peer's queue full is skipped (ZeroMQ sends a multipart message whole or not
/// at all).
void send_or_skip(zmq::socket_t& socket, std::vector<zmq::message_t>& frames);

}  // namespace trainrun::fuzz
