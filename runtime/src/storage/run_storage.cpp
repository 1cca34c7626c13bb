#include "storage/run_storage.h"

#include <trainrun/error.h>

#include <cmath>
#include <cstdio>
#include <fstream>

#include "common/atomic_file.h"

namespace trainrun {
namespace {

const std::vector<std::string> kFixedColumns = {"iteration", "timestamp", "time_total_s"};

std::string csv_escape(const std::string& cell) {
  if (cell.find_first_of(",\"\n") == std::string::npos) return cell;
  std::string out = "\"";
  for (char c : cell) out += (c == '"') ? std::string("\"\"") : std::string(1, c);
  return out + "\"";
}

std::string csv_row(const std::vector<std::string>& columns, const nlohmann::json& record) {
  std::string line;
  for (size_t i = 0; i < columns.size(); ++i) {
    const auto& name = columns[i];
    const nlohmann::json* value = nullptr;
    if (i < kFixedColumns.size()) {
      value = &record.at(name);
    } else if (record["metrics"].contains(name)) {
      value = &record["metrics"][name];
    }
    if (i > 0) line += ",";
    // Full precision in the file (format_value rounds, for the terminal).
    if (value != nullptr)
      line += csv_escape(value->is_string() ? value->get<std::string>() : value->dump());
  }
  return line + "\n";
}

}  // namespace

std::string format_value(const nlohmann::json& value) {
  if (value.is_string()) return value.get<std::string>();
  if (value.is_number_float()) {
    double v = value.get<double>();
    if (!std::isfinite(v)) return std::isnan(v) ? "nan" : (v > 0 ? "inf" : "-inf");
    char buffer[32];
    std::snprintf(buffer, sizeof(buffer), "%.6g", v);
    return buffer;
  }
  return value.dump();
}

std::string format_metrics(const nlohmann::json& metrics) {
  std::string line;
  if (metrics.is_object()) {
    for (const auto& item : metrics.items()) {
      line += (line.empty() ? "" : " ") + item.key() + "=" + format_value(item.value());
    }
  }
  return line.empty() ? "-" : line;
}

RunStorage::RunStorage(const std::filesystem::path& storage_path, const std::string& name)
    : dir_(storage_path / name), results_(dir_ / "result.jsonl"), progress_(dir_ / "progress.csv") {
  std::error_code ec;
  std::filesystem::create_directories(dir_ / "logs", ec);
  if (ec) throw IoError("cannot create run directory " + dir_.string() + ": " + ec.message());
  // A rerun of the same name continues the earlier results.
  std::ifstream earlier(dir_ / "result.jsonl");
  std::string line;
  while (std::getline(earlier, line)) {
    auto record = nlohmann::json::parse(line, nullptr, false);
    if (record.is_discarded() || !record.contains("metrics")) continue;
    add_columns(record);
    rows_.push_back(std::move(record));
  }
}

bool RunStorage::add_columns(const nlohmann::json& record) {
  bool added = csv_columns_.empty();
  if (added) csv_columns_ = kFixedColumns;
  for (const auto& item : record["metrics"].items()) {
    if (std::find(csv_columns_.begin(), csv_columns_.end(), item.key()) == csv_columns_.end()) {
      csv_columns_.push_back(item.key());
      added = true;
    }
  }
  return added;
}

void RunStorage::write_run_info(const nlohmann::json& info) {
  write_file_atomic(dir_ / "run.json", info.dump(2) + "\n");
}

void RunStorage::append_result(const nlohmann::json& record) {
  results_.append(record.dump() + "\n");
  rows_.push_back(record);
  if (add_columns(record)) {
    rewrite_progress_csv();
  } else {
    progress_.append(csv_row(csv_columns_, record));
  }
}

void RunStorage::rewrite_progress_csv() {
  std::string content;
  for (size_t i = 0; i < csv_columns_.size(); ++i) {
    content += (i > 0 ? "," : "") + csv_escape(csv_columns_[i]);
  }
  content += "\n";
  for (const auto& row : rows_) content += csv_row(csv_columns_, row);
  write_file_atomic(dir_ / "progress.csv", content);
  progress_.close();  // the rename replaced the file the descriptor pointed at
}

void RunStorage::write_error(const nlohmann::json& error) {
  auto path = dir_ / "error.json";
  if (error.is_null()) {
    std::error_code ec;
    std::filesystem::remove(path, ec);
    return;
  }
  write_file_atomic(path, error.dump(2) + "\n");
}

}  // namespace trainrun
