#pragma once

// Launching a run from C++: the API behind the `trainrun` command. A Trainer
// owns one run at a time; fit() blocks until it ends and is not thread-safe.
// The workers are processes of the `trainrun-worker` executable; this side
// never loads LibTorch.

#include <trainrun/options.h>
#include <trainrun/result.h>

namespace trainrun {

class Trainer {
 public:
  /// Checks the options. Throws UsageError on a bad value.
  explicit Trainer(TrainerOptions options);

  /// Inspects the plugin, starts the workers, runs train_func on every rank and
  /// waits for the end. Throws PluginError (unusable plugin, before any worker
  /// starts) or IoError (storage); a failed run is a Result with an error.
  Result fit();

 private:
  TrainerOptions options_;
};

}  // namespace trainrun
