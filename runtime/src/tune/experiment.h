#pragma once

// The experiment's record, experiment.json in its directory, replaced
// atomically after every change: what makes its trials (so that a rerun
// resumes the same experiment), every trial's hyperparameters and status, and
// the scheduler's state.
//
//   <storage_path>/<name>/
//     experiment.json      ExperimentRecord
//     .lock                held (flock) by the tuner that runs it (RunLock)
//     report.html          each trial's curve of the metric
//     logs/trial_NNNN.log  each trial process's own output
//     trial_NNNN/          each trial's run directory (run.json, result.jsonl, ...)

#include <trainrun/tuner.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace trainrun::tune {

inline constexpr const char* kExperimentFile = "experiment.json";

struct TrialRecord {
  std::string name;
  nlohmann::json config = nlohmann::json::object();  // its hyperparameters now
  TrialStatus status = TrialStatus::kPending;
  std::string note;
  int64_t iterations = 0;
  std::optional<double> best;
  int64_t best_iteration = 0;
  double started_at = 0;          // unix seconds of its first start; 0: not started
  double ended_at = 0;            // of its end; 0: not ended
  int starts = 0;                 // its processes: resumes and PBT's copies count
  std::string latest_checkpoint;  // its run's latest committed checkpoint (a path)
  /// PBT: the checkpoint its next start begins from, whatever its own, until
  /// it has one of its own past iteration resume_after.
  std::string resume_from;
  int64_t resume_after = 0;
  /// The scheduler's verdict on it not yet carried out (null: none):
  /// {"action": "stop" or "exploit", "reason", "finished", and for an
  /// exploit "config" and "checkpoint"}; a resumed experiment carries it out.
  nlohmann::json verdict;
};

struct ExperimentRecord {
  std::string name;
  /// What makes the trials (space, num_samples, seed, metric, mode,
  /// scheduler): a rerun with another is refused.
  nlohmann::json search = nlohmann::json::object();
  double started_at = 0;
  std::string status = "running";  // running, finished, interrupted
  std::vector<TrialRecord> trials;
  nlohmann::json scheduler_state = nlohmann::json::object();
};

TrialStatus trial_status_from(const std::string& text);

/// Reads <dir>/experiment.json; nothing when it does not exist. Throws IoError
/// when it is unreadable or malformed.
std::optional<ExperimentRecord> read_experiment(const std::filesystem::path& dir);

/// Replaces <dir>/experiment.json atomically; `sync`: durable across a power
/// cut too (a report's counts need not be: a killed process loses nothing
/// the kernel has). Throws IoError.
void write_experiment(const std::filesystem::path& dir, const ExperimentRecord& record,
                      bool sync = true);

}  // namespace trainrun::tune
