#pragma once

// A worker process: `trainrun worker --connect ENDPOINT`. Its main thread owns
// a ZeroMQ DEALER (hello, assignment, plugin download, heartbeats); a second
// thread runs the train function on a connection of its own (train_thread.h).
// The process exits when the controller says SHUTDOWN or goes silent.

#include <chrono>
#include <filesystem>
#include <string>

namespace trainrun {

struct WorkerOptions {
  std::string connect;  // the controller's ROUTER endpoint
  int index = -1;       // launch index of a local worker, -1 for a remote one
  std::filesystem::path cache_dir;
  std::chrono::milliseconds startup_timeout{0};  // waiting for ASSIGN; 0 = default
  std::string secret;  // the run's worker secret, for HELLO and ATTACH
};

/// Runs the worker; returns the process exit code.
int run_worker(const WorkerOptions& options);

}  // namespace trainrun
