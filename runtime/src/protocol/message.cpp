#include "protocol/message.h"

#include <train/report.h>

#include "common/secret.h"

namespace trainrun::protocol {
namespace {

// What any message body may hold: every message is [version, {field: value}]
// with at most lists of small maps in its values (a REPORT's files), so a
// deeper structure, or a count past these, is not a message of ours. Bounds
// the memory and the recursion a peer can make the decoder spend.
const msgpack::unpack_limit kBodyLimits(/*array=*/1 << 20, /*map=*/1 << 16, /*str=*/1 << 20,
                                        /*bin=*/16 << 20, /*ext=*/0, /*depth=*/8);
// train::report's metrics: a map of names to numbers, booleans and strings.
const msgpack::unpack_limit kMetricsLimits(/*array=*/0, /*map=*/train::kMaxMetrics,
                                           /*str=*/train::kMaxMetricText,
                                           /*bin=*/0, /*ext=*/0, /*depth=*/2);

}  // namespace

Incoming Incoming::parse(std::vector<zmq::message_t> frames) {
  if (frames.size() < 2) {
    throw ProtocolError("malformed message: " + std::to_string(frames.size()) +
                        " frame(s), expected a type and a body");
  }
  Incoming message;
  message.type_ = frames[0].to_string();
  if (message.type_.empty() || message.type_.size() > 64) {
    throw ProtocolError("malformed message: bad type frame");
  }
  try {
    message.handle_ = msgpack::unpack(frames[1].data<const char>(), frames[1].size(), nullptr,
                                      nullptr, kBodyLimits);
  } catch (const std::exception& e) {
    throw ProtocolError("malformed " + message.type_ + " message: body is not msgpack (" +
                        e.what() + ")");
  }
  const msgpack::object& body = message.handle_.get();
  if (body.type != msgpack::type::ARRAY || body.via.array.size != 2 ||
      body.via.array.ptr[0].type != msgpack::type::POSITIVE_INTEGER) {
    throw ProtocolError("malformed " + message.type_ +
                        " message: body is not [protocol version, payload]");
  }
  auto version = body.via.array.ptr[0].via.u64;
  if (version != static_cast<uint64_t>(kProtocolVersion)) {
    throw ProtocolError("peer speaks trainrun protocol v" + std::to_string(version) +
                        ", this side speaks v" + std::to_string(kProtocolVersion));
  }
  message.payload_ = body.via.array.ptr[1];
  if (message.payload_.type != msgpack::type::MAP) {
    throw ProtocolError("malformed " + message.type_ + " message: payload is not a map");
  }
  for (size_t i = 2; i < frames.size(); ++i) message.blobs_.push_back(std::move(frames[i]));
  return message;
}

void connect_dealer(zmq::socket_t& socket, const std::string& endpoint) {
  socket.set(zmq::sockopt::routing_id, "peer-" + make_secret().substr(0, 32));
  socket.connect(endpoint);
}

int poll(zmq::pollitem_t* items, size_t count, std::chrono::milliseconds timeout) {
  try {
    return zmq::poll(items, count, timeout);
  } catch (const zmq::error_t& e) {
    if (e.num() == EINTR) return 0;
    throw;
  }
}

std::vector<zmq::message_t> recv_frames(zmq::socket_t& socket, bool dontwait) {
  std::vector<zmq::message_t> frames;
  auto flags = dontwait ? zmq::recv_flags::dontwait : zmq::recv_flags::none;
  do {
    zmq::message_t frame;
    if (!socket.recv(frame, flags)) return frames;
    frames.push_back(std::move(frame));
    flags = zmq::recv_flags::none;  // the rest of a multipart message is already here
  } while (frames.back().more());
  return frames;
}

}  // namespace trainrun::protocol

namespace trainrun::protocol {

nlohmann::json decode_metrics(const std::vector<char>& bytes) {
  try {
    // Checked with bounds first: nlohmann's decoder recurses without one.
    auto handle = msgpack::unpack(bytes.data(), bytes.size(), nullptr, nullptr, kMetricsLimits);
    const auto& map = handle.get();
    if (map.type != msgpack::type::MAP) throw ProtocolError("not a map");
    for (uint32_t i = 0; i < map.via.map.size; ++i) {
      const auto& entry = map.via.map.ptr[i];
      if (entry.key.type != msgpack::type::STR) throw ProtocolError("a name that is not text");
      switch (entry.val.type) {
        case msgpack::type::BOOLEAN:
        case msgpack::type::POSITIVE_INTEGER:
        case msgpack::type::NEGATIVE_INTEGER:
        case msgpack::type::FLOAT32:
        case msgpack::type::FLOAT64:
        case msgpack::type::STR: break;
        default: throw ProtocolError("a value that is not a number, boolean or text");
      }
    }
    return nlohmann::json::from_msgpack(bytes.begin(), bytes.end());
  } catch (const msgpack::map_size_overflow&) {
    throw ProtocolError("more than " + std::to_string(train::kMaxMetrics) +
                        " metrics (a report carries at most that many)");
  } catch (const msgpack::str_size_overflow&) {
    throw ProtocolError("a metric name or text longer than " +
                        std::to_string(train::kMaxMetricText) + " bytes");
  } catch (const std::exception& e) {
    throw ProtocolError(std::string("metrics that are not a map of names to numbers, booleans "
                                    "and text: ") +
                        e.what());
  }
}

}  // namespace trainrun::protocol
