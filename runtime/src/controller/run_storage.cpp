#include "controller/run_storage.h"

#include <trainrun/error.h>

#include <algorithm>

namespace trainrun {
namespace {

// Then one column per metric, in the order they first appear. Which
// checkpoint a report committed is in result.jsonl.
const std::vector<std::string> kFixedColumns = {"iteration", "timestamp", "time_total_s",
                                                "attempt"};

std::string csv_escape(const std::string& cell) {
  if (cell.find_first_of(",\"\n") == std::string::npos) return cell;
  std::string out = "\"";
  for (char c : cell) out += (c == '"') ? std::string("\"\"") : std::string(1, c);
  return out + "\"";
}

std::string csv_row(const std::vector<std::string>& columns, const ReportRecord& record) {
  const nlohmann::json fixed[] = {record.iteration, record.timestamp, record.time_total_s,
                                  record.attempt};
  std::string line;
  for (size_t i = 0; i < columns.size(); ++i) {
    const nlohmann::json* value = nullptr;
    if (i < kFixedColumns.size()) {
      value = &fixed[i];
    } else if (record.metrics.is_object() && record.metrics.contains(columns[i])) {
      value = &record.metrics[columns[i]];
    }
    if (i > 0) line += ",";
    // Full precision in the file (format_value rounds, for the terminal).
    if (value != nullptr) {
      line +=
          csv_escape(value->is_string()
                         ? value->get<std::string>()
                         : value->dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
    }
  }
  return line + "\n";
}

}  // namespace

RunStorage::RunStorage(const std::filesystem::path& storage_path, const std::string& name,
                       RunObjects* objects)
    : dir_(storage_path / name),
      results_(dir_ / run_directory::kResultsFile),
      progress_(dir_ / run_directory::kProgressFile),
      objects_(objects) {
  std::error_code ec;
  std::filesystem::create_directories(dir_ / run_directory::kLogsDir, ec);
  if (ec) throw IoError("cannot create run directory " + dir_.string() + ": " + ec.message());
  lock_ = std::make_unique<run_directory::RunLock>(dir_);
  // What an atomic write left when its process died before the rename
  // (common/atomic_file.h: <file>.tmp.<pid>): nobody else writes here now.
  for (const auto& entry : std::filesystem::directory_iterator(dir_, ec)) {
    if (entry.path().filename().string().find(".tmp.") != std::string::npos) {
      std::filesystem::remove(entry.path(), ec);
    }
  }
  if (objects_ != nullptr) objects_->pull_run_files(dir_);
  // A rerun of the same name continues the earlier results.
  for (auto& record : run_directory::read_results(dir_)) {
    add_columns(record);
    rows_.push_back(std::move(record));
  }
}

bool RunStorage::add_columns(const ReportRecord& record) {
  bool added = csv_columns_.empty();
  if (added) csv_columns_ = kFixedColumns;
  if (!record.metrics.is_object()) return added;
  for (const auto& item : record.metrics.items()) {
    if (std::find(csv_columns_.begin(), csv_columns_.end(), item.key()) == csv_columns_.end()) {
      csv_columns_.push_back(item.key());
      added = true;
    }
  }
  return added;
}

void RunStorage::write_run_info(const run_directory::RunInfo& info, bool push) {
  run_directory::write_run_info(dir_, info);
  if (push && objects_ != nullptr) objects_->push(dir_, run_directory::kRunInfoFile);
}

void RunStorage::push_results(bool now) {
  if (objects_ == nullptr) return;
  results_dirty_ = true;
  auto time = std::chrono::steady_clock::now();
  if (!now && time - results_pushed_ < kPushInterval) return;
  objects_->push(dir_, run_directory::kResultsFile);
  objects_->push(dir_, run_directory::kProgressFile);
  results_pushed_ = time;
  results_dirty_ = false;
}

void RunStorage::flush(const std::vector<std::string>& also) {
  if (objects_ == nullptr) return;
  if (results_dirty_) push_results(true);
  for (const auto& relative : also) objects_->push(dir_, relative);
}

void RunStorage::append_result(const ReportRecord& record) {
  results_.append(run_directory::result_line(record));
  rows_.push_back(record);
  if (add_columns(record)) {
    rewrite_progress_csv();
  } else {
    progress_.append(csv_row(csv_columns_, record));
  }
  push_results(/*now=*/!record.checkpoint.empty());
}

void RunStorage::append_checkpoint(int64_t iteration, const std::string& checkpoint,
                                   double timestamp) {
  results_.append(run_directory::checkpoint_line(iteration, checkpoint, timestamp));
  for (auto row = rows_.rbegin(); row != rows_.rend(); ++row) {
    if (row->iteration == iteration) {
      row->checkpoint = checkpoint;
      break;
    }
  }
  push_results(true);
}

void RunStorage::rewrite_progress_csv() {
  std::string content;
  for (size_t i = 0; i < csv_columns_.size(); ++i) {
    content += (i > 0 ? "," : "") + csv_escape(csv_columns_[i]);
  }
  content += "\n";
  for (const auto& row : rows_) content += csv_row(csv_columns_, row);
  write_file_atomic(dir_ / run_directory::kProgressFile, content);
  progress_.close();  // the rename replaced the file the descriptor pointed at
}

void RunStorage::write_error(const std::optional<RunError>& error,
                             const std::vector<AttemptInfo>& attempts) {
  run_directory::write_error(dir_, error, attempts);
  if (objects_ == nullptr) return;
  if (error) {
    objects_->push(dir_, run_directory::kErrorFile);
  } else {
    objects_->remove(run_directory::kErrorFile);
  }
}

}  // namespace trainrun
