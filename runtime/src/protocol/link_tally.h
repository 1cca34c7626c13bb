#pragma once

// What one end of a connection sent and received, so that a reconnection that
// lost messages is seen. ZeroMQ reconnects a reset TCP connection by itself,
// and a peer with a routing id of its own keeps its place at the controller;
// but what was in flight when the connection broke is gone. Every HEARTBEAT
// carries what its sender sent before it on this connection: messages arrive
// in order, so when it arrives everything sent before it has arrived too,
// unless it was lost. Heartbeats are not counted (losing one costs nothing);
// OUTPUT (a worker's lines, through its node agent) is counted apart, as
// losing some is worth a warning, not the attempt.

#include <cstdint>
#include <string_view>

#include "protocol/messages.h"

namespace trainrun::protocol {

struct LinkLoss {
  int64_t messages = 0;
  int64_t output = 0;
  bool any() const { return messages > 0 || output > 0; }
};

class LinkTally {
 public:
  /// Counts a message of `type` sent, or received (by its type frame, before
  /// it is decoded: the sender counted it whatever it holds).
  void sent(std::string_view type) { count(type, sent_, output_sent_); }
  void received(std::string_view type) { count(type, received_, output_received_); }

  /// A heartbeat that says what was sent before it.
  Heartbeat heartbeat(int64_t now_ms = 0) const { return {now_ms, sent_, output_sent_}; }

  /// What the peer sent before `heartbeat` that never arrived. A loss is told
  /// once: the tally then takes the peer's counts.
  LinkLoss settle(const Heartbeat& heartbeat) {
    LinkLoss loss;
    if (heartbeat.sent >= 0 && heartbeat.sent > received_) {
      loss.messages = heartbeat.sent - received_;
      received_ = heartbeat.sent;
    }
    if (heartbeat.output >= 0 && heartbeat.output > output_received_) {
      loss.output = heartbeat.output - output_received_;
      output_received_ = heartbeat.output;
    }
    return loss;
  }

 private:
  static void count(std::string_view type, int64_t& messages, int64_t& output) {
    if (type == Heartbeat::kType) return;
    ++(type == Output::kType ? output : messages);
  }

  int64_t sent_ = 0;
  int64_t received_ = 0;
  int64_t output_sent_ = 0;
  int64_t output_received_ = 0;
};

}  // namespace trainrun::protocol
