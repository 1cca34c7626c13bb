#include "protocol/handshake.h"

#include <atomic>
#include <cstdint>
#include <cstring>

#include "common/seconds.h"
#include "protocol/message.h"

namespace trainrun::protocol {
namespace {

constexpr int kEvents = ZMQ_EVENT_HANDSHAKE_SUCCEEDED | ZMQ_EVENT_HANDSHAKE_FAILED_AUTH |
                        ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL | ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL;
constexpr int kMismatchesToGiveUp = 3;

}  // namespace

HandshakeWatch::HandshakeWatch(zmq::context_t& context, zmq::socket_t& socket) : socket_(socket) {
  static std::atomic<int> watches{0};
  const auto address = "inproc://trainrun-handshake-" + std::to_string(watches++);
  if (zmq_socket_monitor(socket.handle(), address.c_str(), kEvents) != 0) return;
  events_.emplace(context, zmq::socket_type::pair);
  events_->set(zmq::sockopt::linger, 0);
  events_->connect(address);
}

HandshakeWatch::~HandshakeWatch() {
  if (events_) (void)zmq_socket_monitor(socket_.handle(), nullptr, 0);
}

HandshakeWatch::Outcome HandshakeWatch::wait(std::chrono::milliseconds timeout, int interrupt_fd) {
  if (!events_) return Outcome::kDone;  // no monitor: the first messages tell
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + timeout;
  int mismatches = 0;
  while (true) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) return Outcome::kTimedOut;
    zmq::pollitem_t items[] = {{events_->handle(), 0, ZMQ_POLLIN, 0},
                               {nullptr, interrupt_fd, ZMQ_POLLIN, 0}};
    poll(items, 2, left);
    if (items[1].revents & ZMQ_POLLIN) return Outcome::kInterrupted;
    // [event id (16 bits) and value (32 bits)] [endpoint]
    for (auto event = recv_frames(*events_, true); !event.empty();
         event = recv_frames(*events_, true)) {
      if (event[0].size() < 2) continue;
      uint16_t id = 0;
      std::memcpy(&id, event[0].data(), sizeof(id));
      if (id == ZMQ_EVENT_HANDSHAKE_SUCCEEDED) return Outcome::kDone;
      if (id == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH) return Outcome::kRefused;
      if (++mismatches >= kMismatchesToGiveUp) return Outcome::kMismatch;
    }
  }
}

std::string HandshakeWatch::describe(Outcome outcome, const std::string& endpoint, bool keyed,
                                     std::chrono::milliseconds timeout) {
  switch (outcome) {
    case Outcome::kDone: return "";
    case Outcome::kRefused: return "the controller at " + endpoint + " refused this key";
    case Outcome::kMismatch:
      return "the controller at " + endpoint + " refused this " +
             (keyed ? std::string("key: every handshake ended (a key other than the run's, or a "
                                  "controller without one)")
                    : std::string("connection: every handshake ended (the run has a key: give "
                                  "it with --auth-key)"));
    case Outcome::kTimedOut:
      return "no handshake with the controller at " + endpoint + " within " + seconds_text(timeout);
    case Outcome::kInterrupted:
      return "interrupted before the controller at " + endpoint + " answered";
  }
  return "";
}

}  // namespace trainrun::protocol
