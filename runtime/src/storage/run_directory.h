#pragma once

// The run directory's format: the names of its files and the typed records
// they hold, read and written here and nowhere else.
//
//   <storage_path>/<name>/
//     run.json               RunInfo: what was run, and its status
//     result.jsonl           a ReportRecord per line; an asynchronous
//                            checkpoint's commit in a line of its own
//     progress.csv           a row per report: iteration, timestamp, time_total_s, attempt,
//                            a column per metric (written by RunStorage)
//     checkpoint_state.json  CheckpointState: the kept checkpoints, the latest
//     checkpoint_NNNNNN/     a checkpoint's files, and its manifest.json (Manifest)
//     error.json             RunError of a run that did not finish
//     logs/                  worker-<rank>.log, controller.log
//     .lock                  held (flock) by the live run: RunLock
//
// Writes replace whole files atomically (common/atomic_file.h). Readers throw
// IoError naming the file when it exists but is malformed. Stateless functions,
// safe from any thread.

#include <trainrun/options.h>
#include <trainrun/result.h>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "common/fd.h"

namespace trainrun::run_directory {

inline constexpr const char* kRunInfoFile = "run.json";
inline constexpr const char* kResultsFile = "result.jsonl";
inline constexpr const char* kProgressFile = "progress.csv";
inline constexpr const char* kCheckpointStateFile = "checkpoint_state.json";
inline constexpr const char* kErrorFile = "error.json";
inline constexpr const char* kLogsDir = "logs";
inline constexpr const char* kManifestFile = "manifest.json";
inline constexpr const char* kLockFile = ".lock";
/// A checkpoint being committed: <run>/.staging-checkpoint_NNNNNN.
inline constexpr const char* kStagingPrefix = ".staging-";

/// Now, as run.json records times: UTC, ISO 8601 ("2026-11-22T10:00:00Z").
std::string timestamp_now();

/// "checkpoint_000042".
std::string checkpoint_name(int64_t index);
/// 42 for "checkpoint_000042"; nothing for a name checkpoint_name() does not make.
std::optional<int64_t> checkpoint_index(const std::string& name);

/// run.json.
struct RunInfo {
  struct Plugin {
    std::string path, sha256, entry, sdk_version, torch_version;
  };
  std::string name;
  std::string storage_path;
  Plugin plugin;
  ScalingConfig scaling;  // cpus_per_worker as resolved for the run
  nlohmann::json config = nlohmann::json::object();
  CheckpointConfig checkpoint;  // num_to_keep and the score settings
  std::string trainrun_version, torch_version;
  std::string controller_host;
  std::string started_at, ended_at;  // UTC, ISO 8601; ended_at empty while running
  RunStatus status = RunStatus::kRunning;
  int max_failures = 0;               // FailureConfig's
  std::vector<AttemptInfo> attempts;  // oldest first
};

/// checkpoint_state.json.
struct CheckpointState {
  std::vector<CheckpointInfo> checkpoints;  // kept ones, oldest first; paths inside the run
  std::string latest;                       // the name of the latest; empty = none
  int64_t next_index = 0;                   // of the next checkpoint_NNNNNN
  /// The latest checkpoint, if any.
  std::optional<CheckpointInfo> latest_checkpoint() const;
};

/// One file of a committed checkpoint.
struct ManifestFile {
  std::string path;  // relative, '/'-separated
  uint64_t size = 0;
  std::string sha256;
  int rank = 0;  // the rank that reported it
};

/// A checkpoint's manifest.json, written last: without it, the checkpoint was
/// never committed.
struct Manifest {
  int64_t iteration = 0;
  nlohmann::json metrics;
  std::vector<int> ranks;
  std::vector<ManifestFile> files;  // sorted by path
};

/// run.json; nothing when it does not exist. Throws IoError when malformed.
std::optional<RunInfo> read_run_info(const std::filesystem::path& run_dir);
void write_run_info(const std::filesystem::path& run_dir, const RunInfo& info);

/// Every report result.jsonl records, oldest first (a line cut short by a
/// crash is skipped), each with the checkpoint it committed: in its own line,
/// or for an asynchronous upload in a checkpoint line after it.
std::vector<ReportRecord> read_results(const std::filesystem::path& run_dir);
/// One line of result.jsonl, with its newline.
std::string result_line(const ReportRecord& record);
/// The line of result.jsonl that records an asynchronous upload's commit:
/// {"iteration": N, "checkpoint": NAME, "committed_at": T}, no metrics.
std::string checkpoint_line(int64_t iteration, const std::string& checkpoint, double timestamp);

/// checkpoint_state.json, with paths under `run_dir`; an empty state when it
/// does not exist. Throws IoError when malformed.
CheckpointState read_checkpoint_state(const std::filesystem::path& run_dir);
void write_checkpoint_state(const std::filesystem::path& run_dir, const CheckpointState& state);

/// error.json; nothing when it does not exist. Throws IoError when malformed.
std::optional<RunError> read_error(const std::filesystem::path& run_dir);
/// Writes error.json, or removes a stale one when `error` is empty.
/// error.json: the root cause, and the in-place recoveries of `attempts`.
void write_error(const std::filesystem::path& run_dir, const std::optional<RunError>& error,
                 const std::vector<AttemptInfo>& attempts = {});

/// A checkpoint's manifest. Throws IoError naming the checkpoint when it is
/// missing or malformed.
Manifest read_manifest(const std::filesystem::path& checkpoint_dir);
void write_manifest(const std::filesystem::path& checkpoint_dir, const Manifest& manifest);
/// A manifest from its text; throws IoError naming `checkpoint` when malformed.
Manifest parse_manifest(const std::string& text, const std::string& checkpoint);
/// The text write_manifest writes.
std::string manifest_text(const Manifest& manifest);

/// The run directory held by this process for the length of a run: an
/// exclusive flock on <run>/.lock, which the kernel drops however the process
/// ends, so a run.json that says running with no holder is a crashed run.
class RunLock {
 public:
  /// Takes the lock. Throws UsageError naming the holder's pid and host when
  /// another run holds it, IoError when the file cannot be opened.
  explicit RunLock(const std::filesystem::path& run_dir);
  ~RunLock();
  RunLock(const RunLock&) = delete;
  RunLock& operator=(const RunLock&) = delete;

 private:
  Fd fd_;  // the lock file: the lock goes with it
};

/// Whether a live process holds the run directory.
bool is_held(const std::filesystem::path& run_dir);

/// Checks every file of a committed checkpoint against its manifest (size and
/// sha256). Throws IoError naming the first file that differs or is missing.
void verify_checkpoint(const std::filesystem::path& checkpoint_dir);

/// Whether checkpoint `a` ranks before `b`: by the score attribute, those
/// without it last, or else the more recent first.
bool ranks_before(const CheckpointInfo& a, const CheckpointInfo& b, const CheckpointConfig& config);

}  // namespace trainrun::run_directory
