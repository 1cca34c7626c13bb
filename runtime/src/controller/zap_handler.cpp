#include "controller/zap_handler.h"

#include <vector>

#include "common/secret.h"
#include "protocol/message.h"

namespace trainrun {

ZapHandler::ZapHandler(zmq::context_t& context, const RunKeys& keys)
    : socket_(context, zmq::socket_type::rep),
      client_key_(keys.client_public.begin(), keys.client_public.end()) {
  socket_.set(zmq::sockopt::linger, 0);
  socket_.bind("inproc://zeromq.zap.01");
}

std::optional<std::string> ZapHandler::answer() {
  auto frames = protocol::recv_frames(socket_, true);
  if (frames.empty()) return std::nullopt;
  // Request: version, request id, domain, address, identity, mechanism, credentials...
  auto text = [&](size_t i) { return i < frames.size() ? frames[i].to_string() : std::string(); };
  const std::string mechanism = text(5);
  bool allowed = false;
  if (text(0) == "1.0") {
    if (mechanism == "NULL") {
      allowed = true;  // the private Unix socket; HELLO's secret decides
    } else if (mechanism == "CURVE" && frames.size() >= 7) {
      allowed = frames[6].size() == client_key_.size() &&
                secret_matches(frames[6].to_string(), client_key_);
    }
  }
  // Reply: version, request id, status code, status text, user id, metadata.
  const std::string reply[] = {"1.0",
                               text(1),
                               allowed ? "200" : "400",
                               allowed ? "OK" : "not this run's key",
                               allowed ? "worker" : "",
                               ""};
  for (size_t i = 0; i < 6; ++i) {
    socket_.send(zmq::buffer(reply[i]),
                 i + 1 < 6 ? zmq::send_flags::sndmore : zmq::send_flags::none);
  }
  if (allowed) return std::nullopt;
  return text(3).empty() ? std::string("an unknown address") : text(3);
}

}  // namespace trainrun
