#pragma once

// The run directory <storage_path>/<name>/ as the controller writes it:
// run.json, result.jsonl, progress.csv, error.json and logs/, in the formats of
// storage/run_directory.h. For a run in object storage (RunObjects) the
// directory is a local copy: the stored files replace it at the start, and each
// file is put whole after it changes (result.jsonl and progress.csv at most
// every kPushInterval, and at every checkpoint and flush()). Owned by the
// controller's single thread; not thread-safe.

#include <trainrun/result.h>

#include <chrono>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/atomic_file.h"
#include "storage/run_directory.h"
#include "storage/run_objects.h"

namespace trainrun {

/// How often a run in object storage puts result.jsonl and progress.csv.
inline constexpr std::chrono::seconds kPushInterval{2};

class RunStorage {
 public:
  /// Creates <storage_path>/<name>/ and logs/ if absent, takes the run's lock
  /// for its lifetime, and takes up the results of an earlier run of the same
  /// name. With `objects`, the directory is the local copy of a run in object
  /// storage, and its files are first replaced by the stored ones. Throws
  /// UsageError when another run holds the directory, IoError.
  RunStorage(const std::filesystem::path& storage_path, const std::string& name,
             RunObjects* objects = nullptr);

  const std::filesystem::path& dir() const { return dir_; }
  std::filesystem::path logs_dir() const { return dir_ / run_directory::kLogsDir; }

  /// Writes run.json (atomic replace); in object storage puts it too, unless
  /// `push` is false (flush() puts it later).
  void write_run_info(const run_directory::RunInfo& info, bool push = true);

  /// Appends one report: a line of result.jsonl and a row of progress.csv.
  void append_result(const ReportRecord& record);
  /// Records in result.jsonl that the report of `iteration`, recorded
  /// earlier, committed `checkpoint` (an asynchronous upload) at `timestamp`.
  void append_checkpoint(int64_t iteration, const std::string& checkpoint, double timestamp);

  /// The last report earlier runs of this name recorded, if any: a rerun's
  /// iterations and time_total_s continue from it.
  const ReportRecord* last_result() const { return rows_.empty() ? nullptr : &rows_.back(); }

  /// Writes error.json (atomic replace); removes a stale one when `error` is empty.
  void write_error(const std::optional<RunError>& error,
                   const std::vector<AttemptInfo>& attempts = {});

  /// A run in object storage: puts what changed since it was last put, and
  /// `also` (relative paths: logs, report.html). Nothing for a local run.
  void flush(const std::vector<std::string>& also = {});
  /// The run in object storage, or null.
  RunObjects* objects() const { return objects_; }

 private:
  void rewrite_progress_csv();
  /// Puts result.jsonl and progress.csv now, or when kPushInterval has passed.
  void push_results(bool now);
  /// Adds the record's new metrics as columns; true if the header changed.
  bool add_columns(const ReportRecord& record);

  std::filesystem::path dir_;
  std::unique_ptr<run_directory::RunLock> lock_;
  AppendFile results_;
  AppendFile progress_;
  std::vector<std::string> csv_columns_;
  std::vector<ReportRecord> rows_;  // kept to rewrite progress.csv when a new metric appears
  RunObjects* objects_;
  bool results_dirty_ = false;
  std::chrono::steady_clock::time_point results_pushed_{};
};

}  // namespace trainrun
