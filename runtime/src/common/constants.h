#pragma once

// Defaults of the runtime's timing and transfer parameters. The timeouts are
// configurable through trainrun::TrainerOptions and the command line.

#include <chrono>
#include <cstddef>

namespace trainrun {

using namespace std::chrono_literals;

/// How often controller and workers tell each other they are alive.
constexpr auto kHeartbeatInterval = 1000ms;
/// A peer silent this long is declared lost.
constexpr auto kDefaultHeartbeatTimeout = 30s;
/// How long the controller waits for every worker to say hello.
constexpr auto kDefaultStartupTimeout = 120s;
/// After the first failure, how long to collect others before naming the root
/// cause: a crash on one rank makes its peers' collectives fail a moment later.
constexpr auto kFailureGrace = 300ms;
/// How long workers get to exit after SIGTERM before SIGKILL.
constexpr auto kTerminateGrace = 3s;
/// Plugin transfer: bytes per chunk and chunks in flight (credit).
constexpr size_t kPluginChunkSize = 256 * 1024;
constexpr int kPluginCredit = 8;
/// Checkpoint streaming, both ways: bytes per chunk and chunks in flight per
/// worker, which bound the memory a transfer holds whatever its size.
constexpr size_t kCheckpointChunkSize = 1 << 20;
constexpr int kCheckpointCredit = 8;

}  // namespace trainrun
