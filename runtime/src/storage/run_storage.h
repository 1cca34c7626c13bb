#pragma once

// The run directory <storage_path>/<name>/ and the files the controller keeps in
// it: run.json, result.jsonl, progress.csv, error.json and logs/. Owned by the
// controller's single thread; not thread-safe.

#include <nlohmann/json.hpp>

#include <filesystem>
#include <string>
#include <vector>

#include "common/atomic_file.h"

namespace trainrun {

class RunStorage {
 public:
  /// Creates <storage_path>/<name>/ and logs/ if absent, and takes up the
  /// results of an earlier run of the same name. Throws IoError.
  RunStorage(const std::filesystem::path& storage_path, const std::string& name);

  const std::filesystem::path& dir() const { return dir_; }
  std::filesystem::path logs_dir() const { return dir_ / "logs"; }

  /// Writes run.json (atomic replace).
  void write_run_info(const nlohmann::json& info);

  /// Appends one report: a line of result.jsonl and a row of progress.csv.
  /// `record` holds "iteration", "timestamp", "time_total_s" and "metrics".
  void append_result(const nlohmann::json& record);

  /// Writes error.json (atomic replace); removes a stale one when `error` is null.
  void write_error(const nlohmann::json& error);

 private:
  void rewrite_progress_csv();
  /// Adds the record's new metrics as columns; true if the header changed.
  bool add_columns(const nlohmann::json& record);

  std::filesystem::path dir_;
  AppendFile results_;
  AppendFile progress_;
  std::vector<std::string> csv_columns_;
  std::vector<nlohmann::json> rows_;  // kept to rewrite progress.csv when a new metric appears
};

/// Formats a metric value for the terminal (real numbers to 6 significant digits).
std::string format_value(const nlohmann::json& value);

/// "name=value name=value" for the terminal; "-" when there are none.
std::string format_metrics(const nlohmann::json& metrics);

}  // namespace trainrun
