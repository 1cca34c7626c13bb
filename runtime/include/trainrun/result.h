#pragma once

// What a run leaves behind, as a program reads it (Ray Train's Result): the
// reports, the kept checkpoints and, for a run that did not finish, its root
// cause. load_result() reads it from the run directory; Trainer::fit() returns it.

#include <trainrun/error.h>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace trainrun {

/// Where a run stands. run.json records the first four; a run whose run.json
/// still says running while no process holds its directory is kCrashed (its
/// controller died without a word: kill -9, a power cut).
enum class RunStatus { kRunning, kFinished, kFailed, kInterrupted, kCrashed };

/// "running", "finished", ...: the name run.json and `trainrun results` use.
constexpr std::string_view to_string(RunStatus status) {
  switch (status) {
    case RunStatus::kRunning: return "running";
    case RunStatus::kFinished: return "finished";
    case RunStatus::kFailed: return "failed";
    case RunStatus::kInterrupted: return "interrupted";
    case RunStatus::kCrashed: return "crashed";
  }
  return "unknown";
}

/// Why a run did not finish.
struct RunError {
  FailureKind kind = FailureKind::kException;
  std::string message;
  int rank = -1;  // -1: no rank's fault (storage, interrupted)
  std::string host;
  int64_t pid = 0;
  int attempt = 0;  // the attempt it ended; 0 = not known
  /// Where it happened, innermost frame first ("f at file.cpp:12"): a crash's
  /// stack, or where an exception was thrown; empty where unknown.
  std::vector<std::string> stack{};
  /// One line for the terminal: "rank 1 (host, pid 42) raised: boom".
  std::string summary() const;
};

/// One report, as result.jsonl records it. Iterations and time_total_s count
/// on across attempts and reruns of the same name: an attempt that resumes
/// from a checkpoint redoes the work reported after it, and records it again
/// under new iterations (the attempt tells them apart).
struct ReportRecord {
  int64_t iteration = 0;  // counts on across attempts and reruns of the same name
  double timestamp = 0;   // seconds since the epoch
  double time_total_s = 0;
  nlohmann::json metrics;  // rank 0's
  std::string checkpoint;  // the checkpoint it committed, or empty
  int attempt = 1;         // counts on across reruns of the same name
};

/// One start of the group of workers: the first, and one after each failure
/// that --max-failures allows.
/// A rank lost while the others went on in place, in a smaller group
/// (FailureConfig::in_place): no restart, no step thrown away.
struct InPlaceRecovery {
  int rank = -1;  // the world rank lost
  std::string host;
  int64_t pid = 0;
  std::string cause;   // how it ended: "was killed by SIGKILL"
  std::string at;      // UTC, ISO 8601
  int world_size = 0;  // the group's size after it
  // The synchronised step in flight, as the survivors count them from 1: each
  // backward pass through a prepared model, and each check or average of the
  // SDK's across the ranks (a report's replica check, the Trainer's).
  int64_t step = 0;
  /// Steps no rank applied because of it: the survivors' first step applied
  /// after it, less the one after their last applied before it (0: the step
  /// in flight was done again in the new group). -1 until the first step.
  int64_t steps_lost = -1;
  double seconds = -1;  // from the loss to the survivors' first applied step; -1 until then
  /// A worker started in its place that caught up from a peer: its pid (0:
  /// none joined), and the seconds from the loss to its first step applied
  /// with the group (-1: none).
  int64_t replacement_pid = 0;
  double caught_up_seconds = -1;
};

struct AttemptInfo {
  int attempt = 1;
  int world_size = 0;
  std::string started_at;         // UTC, ISO 8601
  std::string ended_at;           // empty while it runs
  std::string resumed_from;       // the checkpoint it started from, or empty
  std::optional<RunError> error;  // the root cause that ended it, if it failed
  bool regrouped = false;         // an elastic group stopped at a checkpoint to take more workers
  std::vector<InPlaceRecovery> recoveries;  // ranks lost while it went on without them
};

/// A committed checkpoint.
struct CheckpointInfo {
  std::string name;  // checkpoint_NNNNNN
  std::filesystem::path path;
  int64_t iteration = 0;
  nlohmann::json metrics;  // rank 0's metrics of its report
};

/// The outcome of fit() (Ray Train's Result).
struct Result {
  std::filesystem::path path;  // the run directory
  RunStatus status = RunStatus::kRunning;
  nlohmann::json metrics;            // rank 0's last reported metrics (null if none)
  int64_t iterations = 0;            // reports recorded, counting earlier runs of this name
  std::filesystem::path checkpoint;  // the latest committed checkpoint, if any
  /// Kept checkpoints, best first: by the run's score attribute, else the most recent.
  std::vector<CheckpointInfo> best_checkpoints;
  /// Every report of the run (result.jsonl), oldest first.
  std::vector<ReportRecord> history;
  /// The attempts of every run of this name (run.json: the first and the latest 99), oldest first.
  std::vector<AttemptInfo> attempts;
  double wall_seconds = 0;
  std::optional<RunError> error;
  /// Whether the run was stopped by SIGINT or SIGTERM.
  bool interrupted() const { return error && error->kind == FailureKind::kInterrupted; }
};

/// Reads what a run left in its directory (run.json, result.jsonl,
/// checkpoint_state.json, error.json): `trainrun results DIR`. Throws
/// UsageError if `run_dir` holds no run, IoError if a file is unreadable.
Result load_result(const std::filesystem::path& run_dir);

/// Writes the run's page, report.html (self-contained, Chart.js inlined):
/// every numeric metric against iteration and time, the checkpoints (the
/// best marked), the attempts, the run's facts and error. A run writes it in
/// its directory as it goes; this writes it for any run: `trainrun results
/// DIR --html FILE`. Atomic: a reader sees the old page or the new. `file` is a
/// new path or a regular file: a symbolic link, fifo, device or directory is a
/// UsageError (a rename would replace it, not write through it). Throws as
/// load_result does, or IoError (a full disk among them).
void write_html_report(const std::filesystem::path& run_dir, const std::filesystem::path& file);

/// The summary `trainrun results` prints: status, iterations, last metrics,
/// latest and best checkpoints, error.
std::string describe(const Result& result);

}  // namespace trainrun
