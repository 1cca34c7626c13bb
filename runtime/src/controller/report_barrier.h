#pragma once

// train::report is a barrier: every rank reports iteration N, and all of them
// are released together once the last one arrives. This tracks arrivals for the
// current iteration and keeps the metrics recorded: rank 0's, or while rank 0
// is out of the group (recovery in place), the lowest rank's.

#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <vector>

namespace trainrun {

class ReportBarrier {
 public:
  explicit ReportBarrier(int world_size)
      : waiting_(static_cast<size_t>(world_size), false), expected_(world_size) {}

  /// Records rank's arrival at `iteration`, with its metrics (null: none to
  /// record); the lowest rank's that came are kept. Returns an error message
  /// when the rank is out of step (reports an iteration other than the
  /// current one).
  std::optional<std::string> arrive(int rank, int64_t iteration, nlohmann::json metrics);
  /// Whether every rank has arrived at the current iteration.
  bool complete() const;
  /// The recorded metrics of the completed iteration; starts the next iteration.
  nlohmann::json release();
  /// `rank` left the group (in-place recovery): no iteration waits for it.
  void depart(int rank);
  /// A rank back in the group (a replacement): the reports from the next on wait for it.
  void rejoin(int rank);
  bool waiting(int rank) const { return waiting_[static_cast<size_t>(rank)]; }
  /// How many ranks have arrived at the current iteration.
  int arrived() const { return arrived_; }
  /// The iteration being collected (1-based).
  int64_t iteration() const { return iteration_; }

 private:
  std::vector<bool> waiting_;
  int arrived_ = 0;  // ranks waiting_: complete() must not scan a thousand ranks per report
  int expected_;     // the ranks still in the group
  int64_t iteration_ = 1;
  nlohmann::json metrics_;
  int metrics_rank_ = -1;  // whose metrics_ are
};

}  // namespace trainrun
