#pragma once

// Launching a run from C++: the API behind the `trainrun` command. A Trainer
// owns one run at a time; fit() blocks until it ends and is not thread-safe.
// The workers are processes of the `trainrun-worker` executable; this side
// never loads LibTorch.

#include <nlohmann/json.hpp>

#include <chrono>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace trainrun {

/// How many workers, and what each gets (Ray Train's ScalingConfig).
struct ScalingConfig {
  int num_workers = 1;
  /// LibTorch intra-op threads per worker; 0 = cores / local workers (at least 1).
  int cpus_per_worker = 0;
  /// One CUDA device per worker (by local rank) and an NCCL process group.
  /// Needs a LibTorch built with CUDA; otherwise Trainer refuses it.
  bool use_gpu = false;
};

/// Where results go and what the run is called (Ray Train's RunConfig).
struct RunConfig {
  /// Run name; empty = "trainrun-<timestamp>".
  std::string name;
  /// Storage root; empty = ~/trainrun_results. The run directory is storage_path/name.
  std::filesystem::path storage_path;
  /// Start from this committed checkpoint (any run's checkpoint_NNNNNN) when
  /// the run has none of its own; empty = none.
  std::filesystem::path resume_from;
  std::chrono::milliseconds heartbeat_timeout{30000};
  std::chrono::milliseconds startup_timeout{120000};
};

/// Which checkpoints to keep (Ray Train's CheckpointConfig).
struct CheckpointConfig {
  /// Checkpoints kept on disk, the best by score; the latest is kept as well
  /// (a rerun resumes from it). 0 = all.
  int num_to_keep = 0;
  /// The reported metric that ranks checkpoints; empty = the most recent are best.
  std::string score_attribute;
  /// Whether a higher score is better ("max") or a lower one ("min").
  bool score_max = true;
  /// Workers that share the controller's filesystem copy their checkpoint files
  /// into storage themselves; with this, every worker streams them through the
  /// controller's socket instead (as a worker on another host must), and
  /// get_checkpoint() fetches the checkpoint the same way.
  bool always_stream = false;
};

struct TrainerOptions {
  std::filesystem::path plugin;
  /// The plugin's entry; empty = its only one.
  std::string entry;
  /// Handed to train_func as train::Config; must be a JSON object.
  nlohmann::json config = nlohmann::json::object();
  ScalingConfig scaling;
  RunConfig run;
  CheckpointConfig checkpoint;
  /// The worker executable; empty = `trainrun-worker` beside this program or on PATH.
  std::filesystem::path worker_executable;
  /// Workers' plugin cache; empty = $TRAINRUN_CACHE_DIR or ~/.cache/trainrun.
  std::filesystem::path cache_dir;
  /// Print rank 0's metrics and worker output on the terminal.
  bool verbose = true;
};

/// Why a run did not finish.
struct RunError {
  std::string kind;  // "exception", "signal", "exit", "lost", "setup", "plugin", "interrupted"
  std::string message;
  int rank = -1;
  std::string host;
  int64_t pid = 0;
  nlohmann::json to_json() const;
  /// One line for the terminal.
  std::string summary() const;
};

/// A committed checkpoint, as Result lists it.
struct CheckpointInfo {
  std::string name;  // checkpoint_NNNNNN
  std::filesystem::path path;
  int64_t iteration = 0;
  nlohmann::json metrics;  // rank 0's metrics of its report
};

/// The outcome of fit() (Ray Train's Result).
struct Result {
  std::filesystem::path path;        // the run directory
  nlohmann::json metrics;            // rank 0's last reported metrics (null if none)
  int64_t iterations = 0;            // reports recorded, counting earlier runs of this name
  std::filesystem::path checkpoint;  // the latest committed checkpoint, if any
  /// Kept checkpoints, best first: by the run's score attribute, else the most recent.
  std::vector<CheckpointInfo> best_checkpoints;
  /// Every report of the run (result.jsonl), oldest first.
  std::vector<nlohmann::json> history;
  double wall_seconds = 0;
  std::optional<RunError> error;
  /// Whether the run was stopped by SIGINT or SIGTERM.
  bool interrupted() const { return error && error->kind == "interrupted"; }
};

/// Reads what a run left in its directory (run.json, result.jsonl,
/// checkpoint_state.json, error.json): `trainrun results DIR`. Throws
/// UsageError if `run_dir` holds no run, IoError if a file is unreadable.
Result load_result(const std::filesystem::path& run_dir);

/// The summary `trainrun results` prints: status, iterations, last metrics,
/// latest and best checkpoints, error.
std::string describe(const Result& result);

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
