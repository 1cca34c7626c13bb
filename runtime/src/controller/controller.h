#pragma once

// The controller of one run: binds the ROUTER socket, starts the local workers,
// serves the plugin, relays rank 0's rendezvous address, runs the report
// barrier, forwards worker output, watches heartbeats and process exits, and
// stops every worker at the end. Everything happens on the calling thread, in
// one poll loop. It never loads LibTorch: workers do.

#include <trainrun/trainer.h>

#include <spdlog/logger.h>

#include <memory>
#include <string>

#include "storage/checkpoint_store.h"
#include "storage/run_storage.h"

namespace trainrun {

struct ControllerSetup {
  TrainerOptions options;
  std::string entry;
  std::string plugin_bytes;
  std::string plugin_sha256;
  int cpus_per_worker = 1;
  std::shared_ptr<spdlog::logger> log;
};

class Controller {
 public:
  Controller(ControllerSetup setup, RunStorage& storage, CheckpointStore& checkpoints);
  ~Controller();
  Controller(const Controller&) = delete;
  Controller& operator=(const Controller&) = delete;

  /// Runs to the end. The Result carries the root cause of a failure and the
  /// wall time; what the run recorded is in its directory (load_result).
  Result run();

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace trainrun
