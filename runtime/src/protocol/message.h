#pragma once

// Framing of every trainrun message: one ZeroMQ multipart message made of
//   [type: text] [body: msgpack array (protocol version, payload map)] [blobs...]
// Bodies are decoded defensively: anything malformed is a ProtocolError, which
// the receiving loop logs and drops. Sockets are not thread-safe; each function
// here is used by the one thread that owns the socket.

#include <trainrun/error.h>

#include <msgpack.hpp>
#include <nlohmann/json.hpp>
#include <zmq.hpp>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

namespace trainrun::protocol {

/// Bumped on any incompatible change to a message.
constexpr int kProtocolVersion = 10;

/// A received message. `payload` points into `handle`, which owns the memory.
class Incoming {
 public:
  /// Parses frames (without a ROUTER's routing id). Throws ProtocolError.
  static Incoming parse(std::vector<zmq::message_t> frames);

  const std::string& type() const { return type_; }
  std::vector<zmq::message_t>& blobs() { return blobs_; }

  /// The payload as T (a MSGPACK_DEFINE_MAP struct). Throws ProtocolError if its
  /// shape does not match.
  template <typename T>
  T as() const {
    try {
      T value;
      payload_.convert(value);
      return value;
    } catch (const std::exception& e) {
      throw ProtocolError("malformed " + type_ + " message: " + e.what());
    }
  }

 private:
  std::string type_;
  msgpack::object_handle handle_;
  msgpack::object payload_;
  std::vector<zmq::message_t> blobs_;
};

/// Packs [version, payload] for `payload` of any MSGPACK_DEFINE_MAP struct.
template <typename T>
zmq::message_t pack_body(const T& payload) {
  msgpack::sbuffer buffer;
  msgpack::packer<msgpack::sbuffer> packer(buffer);
  packer.pack_array(2);
  packer.pack(kProtocolVersion);
  packer.pack(payload);
  return zmq::message_t(buffer.data(), buffer.size());
}

/// Sends a message; on a ROUTER socket `routing_id` names the peer.
template <typename T>
void send(zmq::socket_t& socket, const T& payload, std::vector<zmq::message_t> blobs = {},
          const std::optional<std::string>& routing_id = std::nullopt) {
  if (routing_id) socket.send(zmq::buffer(*routing_id), zmq::send_flags::sndmore);
  bool more = !blobs.empty();
  socket.send(zmq::buffer(std::string(T::kType)), zmq::send_flags::sndmore);
  socket.send(pack_body(payload), more ? zmq::send_flags::sndmore : zmq::send_flags::none);
  for (size_t i = 0; i < blobs.size(); ++i) {
    socket.send(blobs[i], i + 1 < blobs.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
  }
}

/// Sends a message of two frames on a DEALER unless its queue is full: then
/// returns false and sends nothing (the rest of a message whose first frame
/// was queued is queued too).
template <typename T>
bool try_send(zmq::socket_t& socket, const T& payload) {
  auto body = pack_body(payload);  // first: nothing can fail between the two frames
  if (!socket.send(zmq::buffer(std::string(T::kType)),
                   zmq::send_flags::sndmore | zmq::send_flags::dontwait)) {
    return false;
  }
  return socket.send(body, zmq::send_flags::dontwait).has_value();
}

/// train::report's metrics as a REPORT carries them (msgpack): a map of names
/// to numbers, booleans and text, at most 4096 entries. Throws ProtocolError
/// for anything else, without unbounded recursion however deep the input nests.
nlohmann::json decode_metrics(const std::vector<char>& bytes);

/// Gives a DEALER a routing id of its own (random, never starting with a zero
/// byte) and connects it. ZeroMQ reconnects a connection that was reset, and
/// with the same id (and the controller's ROUTER_HANDOVER) the peer keeps its
/// place instead of arriving as a stranger.
void connect_dealer(zmq::socket_t& socket, const std::string& endpoint);

/// zmq::poll that returns 0 when a signal interrupts it, instead of throwing:
/// the caller's loop comes round again and handles the signal.
int poll(zmq::pollitem_t* items, size_t count, std::chrono::milliseconds timeout);

/// Receives all frames of one multipart message (non-blocking when `dontwait`).
/// Returns an empty vector when nothing was waiting.
std::vector<zmq::message_t> recv_frames(zmq::socket_t& socket, bool dontwait = false);

}  // namespace trainrun::protocol
