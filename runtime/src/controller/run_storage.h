#pragma once

// The run directory <storage_path>/<name>/ as the controller writes it:
// run.json, result.jsonl, progress.csv, error.json and logs/, in the formats of
// storage/run_directory.h. Owned by the controller's single thread; not
// thread-safe.

#include <trainrun/result.h>

#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/atomic_file.h"
#include "storage/run_directory.h"

namespace trainrun {

class RunStorage {
 public:
  /// Creates <storage_path>/<name>/ and logs/ if absent, takes the run's lock
  /// for its lifetime, and takes up the results of an earlier run of the same
  /// name. Throws UsageError when another run holds the directory, IoError.
  RunStorage(const std::filesystem::path& storage_path, const std::string& name);

  const std::filesystem::path& dir() const { return dir_; }
  std::filesystem::path logs_dir() const { return dir_ / run_directory::kLogsDir; }

  /// Writes run.json (atomic replace).
  void write_run_info(const run_directory::RunInfo& info);

  /// Appends one report: a line of result.jsonl and a row of progress.csv.
  void append_result(const ReportRecord& record);
  /// Records in result.jsonl that the report of `iteration`, recorded
  /// earlier, committed `checkpoint` (an asynchronous upload) at `timestamp`.
  void append_checkpoint(int64_t iteration, const std::string& checkpoint, double timestamp);

  /// The last report earlier runs of this name recorded, if any: a rerun's
  /// iterations and time_total_s continue from it.
  const ReportRecord* last_result() const { return rows_.empty() ? nullptr : &rows_.back(); }

  /// Writes error.json (atomic replace); removes a stale one when `error` is empty.
  void write_error(const std::optional<RunError>& error);

 private:
  void rewrite_progress_csv();
  /// Adds the record's new metrics as columns; true if the header changed.
  bool add_columns(const ReportRecord& record);

  std::filesystem::path dir_;
  std::unique_ptr<run_directory::RunLock> lock_;
  AppendFile results_;
  AppendFile progress_;
  std::vector<std::string> csv_columns_;
  std::vector<ReportRecord> rows_;  // kept to rewrite progress.csv when a new metric appears
};

}  // namespace trainrun
