#pragma once

// What the controller knows of one node agent (`trainrun worker --nproc N`):
// the host it runs on and the workers it started there. Its word about a
// worker (output, exit) counts only for the pids it named in its AGENT, on the
// host it named, and no two agents may name the same process. The run key
// authenticates agents as it does workers; without a key, anyone who reaches
// the port may join, as a worker or as an agent. Output of a worker whose HELLO
// has not arrived yet waits here, bounded, for the worker's slot.

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "protocol/link_tally.h"

namespace trainrun {

struct NodeAgent {
  /// At most this much output an agent's workers wrote before they connected
  /// is kept; the rest is counted and dropped.
  static constexpr size_t kMaxEarlyOutput = 256 * 1024;

  std::string host;
  int64_t pid = 0;
  std::unordered_set<int64_t> workers;  // still running, as far as it said
  bool announced = false;               // its AGENT for this attempt came
  int nproc = 0;                        // workers it announced last
  // It joined an elastic run during an attempt: its workers wait (ended) for
  // the next attempt, which the next committed checkpoint starts.
  bool waiting = false;
  bool refused = false;  // its AGENT after a RESTART found no room: it is sent away
  std::unordered_map<int64_t, std::array<std::string, 2>> early_output;  // by pid: stdout, stderr
  size_t early_bytes = 0;
  size_t dropped_bytes = 0;
  std::chrono::steady_clock::time_point last_heard;
  protocol::LinkTally link;  // its connection's messages, both ways

  /// "the node agent on host (pid 7)".
  std::string describe() const {
    return "the node agent on " + host + " (pid " + std::to_string(pid) + ")";
  }
};

}  // namespace trainrun
