#pragma once

// The runtime's fixed timing and transfer parameters. The timeouts a user may
// change have their defaults in <trainrun/options.h>.

#include <chrono>
#include <cstddef>

namespace trainrun {

/// How often controller and workers tell each other they are alive, at most;
/// a heartbeat timeout shorter than kHeartbeatsPerTimeout intervals shortens
/// the interval, so that any accepted timeout leaves room for several.
constexpr std::chrono::milliseconds kHeartbeatInterval{1000};
constexpr int kHeartbeatsPerTimeout = 4;
/// The shortest heartbeat timeout accepted.
constexpr std::chrono::milliseconds kMinHeartbeatTimeout{100};

/// The heartbeat interval for a run with this heartbeat timeout.
constexpr std::chrono::milliseconds heartbeat_interval(std::chrono::milliseconds timeout) {
  auto scaled = timeout / kHeartbeatsPerTimeout;
  return scaled < kHeartbeatInterval ? scaled : kHeartbeatInterval;
}
/// After the first failure, how long to collect others before naming the root
/// cause: a crash on one rank makes its peers' collectives fail a moment later.
constexpr std::chrono::milliseconds kFailureGrace{300};
/// How long workers get to exit after SIGTERM before SIGKILL.
constexpr std::chrono::milliseconds kTerminateGrace{3000};
/// Every transfer in chunks (plugin and checkpoint downloads, checkpoint
/// streaming): bytes per chunk and chunks in flight per worker, which bound the
/// memory a transfer holds whatever its size.
constexpr size_t kChunkSize = 1 << 20;
constexpr int kChunkCredit = 8;
/// How long a worker's helper may take to walk every thread's stack, and how
/// long the controller waits for every worker's answer: the walk, its
/// hand-over, and a margin.
constexpr std::chrono::milliseconds kStackWalkBound{5000};
constexpr std::chrono::milliseconds kStacksWait{9000};

}  // namespace trainrun
