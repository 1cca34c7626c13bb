#pragma once

// Launching a run from C++: the API behind the `trainrun` command, in the
// shape of Ray Train's (Trainer, fit, Result, callbacks). The workers are
// processes of the `trainrun-worker` executable; this side never loads
// LibTorch.
//
// Threads: fit() blocks the calling thread until the run ends, and calls the
// callbacks on that thread, in order. stop() may be called from any thread, at
// any time. A Trainer runs one fit() at a time; a second concurrent fit() on
// the same Trainer throws UsageError. Several Trainers may run one after
// another in one process; two runs at once in one process are not supported.
// Without TrainerOptions::handle_signals the run installs no process-wide
// signal handler.

#include <trainrun/options.h>
#include <trainrun/result.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string_view>

namespace spdlog::sinks {
class sink;
}  // namespace spdlog::sinks

namespace trainrun {

/// Where a live run is (Callbacks::on_progress): rank 0's training loader
/// (train::prepare_data_loader) says its epoch and batch, with no change to
/// the train function.
struct Progress {
  int attempt = 1;
  int world_size = 1;
  int64_t epoch = 0;    // the loader's (set_epoch), usually from 0
  int64_t epochs = 0;   // the run's config "epochs", when it has that integer; else 0
  int64_t batch = 0;    // batches done in this epoch, on each rank ...
  int64_t batches = 0;  // ... of these; 0 when not known (a sampler of the user's own)
  int64_t steps = 0;    // batches done in this attempt
  /// Rank 0's samples times the world size, a second, over the last 10
  /// seconds; 0 until known.
  double samples_per_second = 0;
  double elapsed_seconds = 0;  // since fit() began
  /// Seconds to the end of the run when `epochs` is known, else to the end
  /// of this epoch; empty until a rate is known, and without `batches`.
  std::optional<double> eta_seconds;
  nlohmann::json metrics;  // the latest report's (null before the first)
};

/// What a host program hears of a run (Ray Train's callbacks), each on the
/// thread that runs fit(). A callback must not call fit(); stop() is fine. An
/// exception from a callback is logged and ignored: the run goes on.
struct Callbacks {
  /// Every report, once recorded: rank 0's metrics, and the checkpoint
  /// committed with it, if any (an asynchronous checkpoint is not committed
  /// yet: on_checkpoint tells when it is).
  std::function<void(const ReportRecord&)> on_report;
  /// Asked of every report once its synchronous checkpoint is committed, and
  /// before any rank goes on or the report is written to result.jsonl (Ray
  /// Tune's stopper): a reason ends the run there as interrupted, with that
  /// reason as its error's message, the report recorded and the checkpoints
  /// kept; the ranks, waiting in train::report, are stopped (a checkpoint
  /// still uploading asynchronously is not committed). It holds every rank,
  /// and the controller's heartbeats, while it runs: keep it well under the
  /// heartbeat timeout.
  std::function<std::optional<std::string>(const ReportRecord&)> should_stop;
  /// The group of workers starts: the first attempt, and each restart. Its
  /// world_size is the most until the ranks are assigned (an elastic group
  /// may start with fewer: on_attempt_end and run.json say how many).
  std::function<void(const AttemptInfo&)> on_attempt_start;
  /// An attempt ended; its error says why when it failed (a restart follows
  /// when failures remain).
  std::function<void(const AttemptInfo&)> on_attempt_end;
  /// The run ended; fit() returns the same Result.
  std::function<void(const Result&)> on_end;
  /// Every line the run would print on the terminal (the controller's
  /// messages, and worker output prefixed with its rank), instead of stdout
  /// and stderr: with verbose off, only errors. Lines are whole, without
  /// their newline (a message of several lines comes as several calls). The
  /// run's logs/ files are written either way.
  std::function<void(std::string_view line)> on_output;
  /// The same lines into a spdlog sink of the host's, instead of stdout (with
  /// on_output, both get them): the controller's at their level, worker
  /// output at info (none with verbose off); the sink's own level and pattern
  /// apply. It must come from the spdlog the runtime was built with (Debian's
  /// libspdlog).
  std::shared_ptr<spdlog::sinks::sink> log_sink;
  /// Where the run is while rank 0's training loader runs (Progress): up to
  /// ten times a second, and at each epoch's end. Nothing when the train
  /// function uses no prepared loader.
  std::function<void(const Progress&)> on_progress;
  /// Every checkpoint, once committed: right after on_report for a
  /// synchronous one, when its upload is in for an asynchronous one.
  std::function<void(const CheckpointInfo&)> on_checkpoint;
};

class Trainer {
 public:
  /// Checks the options. Throws UsageError on a bad value.
  explicit Trainer(TrainerOptions options, Callbacks callbacks = {});
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  /// Inspects the plugin, starts the workers, runs train_func on every rank and
  /// waits for the end. Throws PluginError (unusable plugin, before any worker
  /// starts) or IoError (storage); a failed run is a Result with an error.
  Result fit();

  /// Ends the fit() in progress as interrupted, in order (workers stopped,
  /// records written); a stop() before fit() starts is forgotten. Returns at
  /// once: one write() to an eventfd, safe from any thread and from a signal
  /// handler.
  void stop();

 private:
  struct State;
  TrainerOptions options_;
  Callbacks callbacks_;
  std::shared_ptr<State> state_;
};

}  // namespace trainrun
