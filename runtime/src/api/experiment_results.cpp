// What an experiment left, as a program reads it (ResultGrid), and the table
// of its trials.

#include <trainrun/error.h>
#include <trainrun/tuner.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <sstream>

#include "api/experiment_table.h"
#include "tune/experiment.h"

namespace trainrun {
namespace {

using json = nlohmann::json;

std::string cell(const json& value) {
  if (value.is_number_float()) {
    char text[32];
    std::snprintf(text, sizeof(text), "%.6g", value.get<double>());
    return text;
  }
  std::string text = value.is_string() ? value.get<std::string>() : value.dump();
  return text.size() > 24 ? text.substr(0, 21) + "..." : text;
}

bool better(double a, double b, bool max) { return max ? a > b : a < b; }

// A trial's best value of `metric` over its reports, and that report.
std::optional<std::pair<double, const ReportRecord*>> best_report(const TrialResult& trial,
                                                                  const std::string& metric,
                                                                  bool max, bool checkpointed) {
  std::optional<std::pair<double, const ReportRecord*>> best;
  for (const auto& report : trial.result.history) {
    if (checkpointed && report.checkpoint.empty()) continue;
    if (!report.metrics.is_object()) continue;
    auto it = report.metrics.find(metric);
    if (it == report.metrics.end() || !it->is_number()) continue;
    const double value = it->get<double>();
    if (value != value) continue;  // NaN
    if (!best || better(value, best->first, max)) best.emplace(value, &report);
  }
  return best;
}

bool mode_max(std::string_view mode, bool fallback) {
  if (mode.empty()) return fallback;
  if (mode == "max") return true;
  if (mode == "min") return false;
  throw UsageError("mode is max or min, not '" + std::string(mode.substr(0, 16)) + "'");
}

}  // namespace

TrialResult trial_result(const tune::TrialRecord& t) {
  TrialResult r;
  r.name = t.name;
  r.config = t.config;
  r.status = t.status;
  r.note = t.note;
  r.iterations = t.iterations;
  r.best = t.best;
  r.best_iteration = t.best_iteration;
  return r;
}

std::vector<std::string> trial_table(const std::vector<TrialResult>& trials,
                                     const std::string& metric, bool max) {
  std::map<std::string, int> counts;
  std::vector<std::string> keys;
  for (const auto& t : trials) {
    ++counts[std::string(to_string(t.status))];
    for (const auto& [key, value] : t.config.items()) {
      if (std::find(keys.begin(), keys.end(), key) == keys.end()) keys.push_back(key);
    }
  }
  std::string summary = "Trials: " + std::to_string(trials.size());
  for (const auto& [status, count] : counts) summary += ", " + std::to_string(count) + " " + status;
  const TrialResult* best = nullptr;
  for (const auto& t : trials) {
    if (t.best && (best == nullptr || better(*t.best, *best->best, max))) best = &t;
  }
  if (best != nullptr) {
    summary += " | best " + metric + " " + cell(*best->best) + " (" + best->name + ")";
  }
  std::vector<std::vector<std::string>> rows;
  std::vector<std::string> header{"trial", "status"};
  header.insert(header.end(), keys.begin(), keys.end());
  header.push_back("reports");
  header.push_back(metric + " (" + (max ? "max" : "min") + ")");
  rows.push_back(header);
  for (const auto& t : trials) {
    std::vector<std::string> row{t.name, std::string(to_string(t.status))};
    for (const auto& key : keys) row.push_back(t.config.contains(key) ? cell(t.config[key]) : "-");
    row.push_back(std::to_string(t.iterations));
    row.push_back(t.best ? cell(*t.best) : "-");
    rows.push_back(std::move(row));
  }
  std::vector<size_t> widths(header.size(), 0);
  for (const auto& row : rows) {
    for (size_t i = 0; i < row.size(); ++i) widths[i] = std::max(widths[i], row[i].size());
  }
  std::vector<std::string> lines{summary};
  for (const auto& row : rows) {
    std::string line;
    for (size_t i = 0; i < row.size(); ++i) {
      line += row[i];
      if (i + 1 < row.size()) line += std::string(widths[i] - row[i].size() + 2, ' ');
    }
    lines.push_back(line);
  }
  return lines;
}

const TrialResult* ResultGrid::best(std::string_view metric_name, std::string_view mode) const {
  const std::string name = metric_name.empty() ? metric : std::string(metric_name);
  const bool is_max = mode_max(mode, max);
  const TrialResult* found = nullptr;
  double found_value = 0;
  for (const auto& trial : trials) {
    std::optional<double> value;
    if (auto b = best_report(trial, name, is_max, false)) {
      value = b->first;
    } else if (name == metric && is_max == max && trial.best) {
      value = trial.best;  // its run's record is gone: the experiment's
    }
    if (value && (found == nullptr || better(*value, found_value, is_max))) {
      found = &trial;
      found_value = *value;
    }
  }
  return found;
}

std::filesystem::path ResultGrid::best_checkpoint(std::string_view metric_name,
                                                  std::string_view mode) const {
  const auto* trial = best(metric_name, mode);
  if (trial == nullptr) return {};
  const std::string name = metric_name.empty() ? metric : std::string(metric_name);
  if (auto b = best_report(*trial, name, mode_max(mode, max), true)) {
    auto path = trial->result.path / b->second->checkpoint;
    std::error_code ec;
    if (std::filesystem::exists(path, ec)) return path;
  }
  return trial->result.checkpoint;  // the best was not kept: its latest
}

int ResultGrid::num_errors() const {
  return static_cast<int>(std::count_if(trials.begin(), trials.end(), [](const TrialResult& t) {
    return t.status == TrialStatus::kFailed;
  }));
}

ResultGrid load_experiment(const std::filesystem::path& dir) {
  auto record = tune::read_experiment(dir);
  if (!record) throw UsageError(dir.string() + " holds no experiment (no experiment.json)");
  ResultGrid grid;
  grid.path = dir;
  grid.metric = record->search.value("metric", "");
  grid.max = record->search.value("mode", "max") != "min";
  for (const auto& t : record->trials) {
    TrialResult r = trial_result(t);
    const auto run_dir = dir / t.name;
    std::error_code ec;
    if (std::filesystem::exists(run_dir / "run.json", ec)) {
      try {
        r.result = load_result(run_dir);
      } catch (const std::exception&) {  // the experiment's record still says what it did
        r.result.path = run_dir;
      }
    }
    grid.trials.push_back(std::move(r));
  }
  return grid;
}

std::string describe(const ResultGrid& grid) {
  std::ostringstream out;
  out << "experiment: " << grid.path.string() << "\n";
  for (const auto& line : trial_table(grid.trials, grid.metric, grid.max)) out << line << "\n";
  for (const auto& t : grid.trials) {
    if (!t.note.empty()) out << t.name << ": " << t.note << "\n";
  }
  if (const auto* best = grid.best()) {
    out << "best trial: " << best->name << " " << best->config.dump() << "\n";
    const auto checkpoint = grid.best_checkpoint();
    out << "best checkpoint: " << (checkpoint.empty() ? "none" : checkpoint.string()) << "\n";
  } else {
    out << "best trial: none reported " << grid.metric << "\n";
  }
  return out.str();
}

}  // namespace trainrun
