// Result as a program reads it back: load_result, describe, RunError::summary.

#include <trainrun/error.h>
#include <trainrun/result.h>

#include <algorithm>
#include <sstream>

#include "api/stored_run.h"
#include "common/metrics_format.h"
#include "common/worker_name.h"
#include "storage/run_directory.h"
#include "storage/s3_config.h"

namespace trainrun {

std::string RunError::summary() const {
  if (rank < 0) return message;
  return describe_worker(rank, host, pid) + " " + message;
}

Result load_result(const std::filesystem::path& run_dir) {
  if (s3::is_s3_url(run_dir.string())) {
    StoredRun stored(run_dir.string());
    auto result = load_result(stored.dir());
    // Nothing tells a crashed run in object storage from a running one.
    if (result.status == RunStatus::kCrashed) result.status = RunStatus::kRunning;
    result.path = stored.url();
    if (!result.checkpoint.empty()) {
      result.checkpoint = stored.url() + "/" + result.checkpoint.filename().string();
    }
    for (auto& c : result.best_checkpoints) c.path = stored.url() + "/" + c.name;
    return result;
  }
  auto info = run_directory::read_run_info(run_dir);
  if (!info) throw UsageError(run_dir.string() + " holds no trainrun run (no run.json)");
  Result result;
  result.path = run_dir;
  result.status = info->status;
  if (result.status == RunStatus::kRunning && !run_directory::is_held(run_dir)) {
    result.status = RunStatus::kCrashed;  // no final word, and nobody is running it
  }
  result.history = run_directory::read_results(run_dir);
  if (!result.history.empty()) {
    result.metrics = result.history.back().metrics;
    result.iterations = result.history.back().iteration;
  }
  auto state = run_directory::read_checkpoint_state(run_dir);
  if (!state.latest.empty()) result.checkpoint = run_dir / state.latest;
  // Best first, by the score settings the run recorded.
  result.best_checkpoints = state.checkpoints;
  std::stable_sort(result.best_checkpoints.begin(), result.best_checkpoints.end(),
                   [&](const auto& a, const auto& b) {
                     return run_directory::ranks_before(a, b, info->checkpoint);
                   });
  result.error = run_directory::read_error(run_dir);
  result.attempts = info->attempts;
  return result;
}

std::string describe(const Result& result) {
  std::ostringstream out;
  out << "run:          " << result.path.string() << "\n"
      << "status:       " << to_string(result.status)
      << (result.status == RunStatus::kCrashed
              ? " (run.json says running, and no process holds the run)"
              : "")
      << "\n"
      << "iterations:   " << result.iterations << "\n"
      << "last metrics: " << format_metrics(result.metrics) << "\n"
      << "checkpoint:   " << (result.checkpoint.empty() ? "-" : result.checkpoint.string()) << "\n";
  if (!result.best_checkpoints.empty()) {
    out << "best checkpoints:\n";
    for (const auto& c : result.best_checkpoints) {
      out << "  " << c.name << "  iteration " << c.iteration << "  " << format_metrics(c.metrics)
          << "\n";
    }
  }
  // What else the run directory holds for a person to open.
  std::error_code ec;
  std::vector<std::string> profiles;
  for (const auto& entry : std::filesystem::directory_iterator(result.path / "profiles", ec)) {
    if (entry.path().extension() == ".json") profiles.push_back(entry.path().string());
  }
  std::sort(profiles.begin(), profiles.end());
  if (!profiles.empty()) {
    out << "profiles:     (Chrome traces: ui.perfetto.dev, or TensorBoard)\n";
    for (const auto& profile : profiles) out << "  " << profile << "\n";
  }
  // Ranks lost while the others went on in place.
  for (const auto& a : result.attempts) {
    for (const auto& r : a.recoveries) {
      out << "recovered:    rank " << r.rank << " " << r.cause << " at step " << r.step << "; "
          << r.world_size << " went on in place (attempt " << a.attempt << "), steps lost "
          << r.steps_lost << ", " << r.seconds << " s to the next step";
      if (r.replacement_pid != 0) {
        out << "; a replacement (pid " << r.replacement_pid << ") caught up " << r.caught_up_seconds
            << " s after the loss";
      }
      out << "\n";
    }
  }
  // A run that restarted: each attempt and what ended it.
  if (result.attempts.size() > 1) {
    out << "attempts:\n";
    for (const auto& a : result.attempts) {
      out << "  " << a.attempt << "  " << a.world_size << " workers  " << a.started_at;
      if (!a.resumed_from.empty()) out << "  from " << a.resumed_from;
      if (a.error) out << "  ended: " << a.error->summary();
      if (a.regrouped) out << "  ended: regrouped to take more workers";
      out << "\n";
    }
  }
  if (result.error) {
    out << "error:        " << result.error->summary();
    if (result.error->attempt > 1) out << " (attempt " << result.error->attempt << ")";
    out << "\n";
  }
  return out.str();
}

}  // namespace trainrun
