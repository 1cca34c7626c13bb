#pragma once

// A worker process: `trainrun worker --connect ENDPOINT`. Its main thread owns
// a ZeroMQ DEALER (hello, assignment, plugin download, heartbeats); a second
// thread runs the train function on a connection of its own (train_thread.h).
// The process exits when the controller says SHUTDOWN or goes silent.

#include <zmq.hpp>

#include <chrono>
#include <filesystem>
#include <optional>
#include <string>

#include "common/run_key.h"

namespace trainrun {

struct WorkerOptions {
  std::string connect;  // the controller's ROUTER endpoint
  int index = -1;       // launch index of a local worker, -1 for a remote one
  std::filesystem::path cache_dir;
  std::chrono::milliseconds startup_timeout{0};  // waiting for ASSIGN; 0 = default
  std::string secret;                            // the run's worker secret, for HELLO and ATTACH
  std::optional<RunKeys> keys;                   // from the run key: CURVE to the controller
  std::string interface;  // the network interface Gloo binds, when the controller leaves it open
  int attempt = 0;        // a node agent's worker: the attempt it was started for; 0 = any
  int64_t agent_pid = 0;  // a node agent's worker: the agent's pid; 0 = none
  // A thread of the controller's own process (common/in_process.h): the
  // controller cannot go silent without this process ending, and a debugger
  // that stops every thread for minutes must not part them.
  bool in_process = false;
  // An in-process worker's: the user's plugin file, loaded where it is (so
  // that a debugger names it) when it is still the one the controller sent.
  std::filesystem::path plugin;
  int stop_fd = -1;  // an in-process worker's: readable when the controller stops it
};

/// Connects `socket` to the controller, with CURVE when there is a run key.
/// The connection of a `channel` (the train thread's, its store's, its upload
/// thread's) is watched by the worker's main thread: ZeroMQ would reconnect it
/// after a reset, but what was in flight on it is lost, and the attempt cannot
/// go on as if it were not.
void connect_to_controller(zmq::socket_t& socket, const WorkerOptions& options,
                           const char* channel = nullptr);

/// Runs the worker and ends the process with its exit code.
[[noreturn]] void run_worker(const WorkerOptions& options);

/// Runs the worker on this thread of the controller's process; returns its
/// exit code. `train_left_running` is set when the train function was still
/// running when the worker stopped: its thread goes on, and only the
/// process's end stops it.
int run_worker_in_process(const WorkerOptions& options, bool& train_left_running);

}  // namespace trainrun
