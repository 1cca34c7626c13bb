#include "protocol/message.h"

namespace trainrun::protocol {

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
    message.handle_ = msgpack::unpack(frames[1].data<const char>(), frames[1].size());
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
