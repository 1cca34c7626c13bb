#pragma once

// train::report across the ranks: the barrier, the arrival before a report
// (a rank with prepared models waits here for every rank to reach the report
// before the replica check's collective), the check that no rank returns
// from train_func while others wait in report forever, and the record of each
// completed report. Pure: it decides, and the controller sends the answers
// and writes the records. Every call is O(1) in the world size on the common
// path, so a report of 1024 ranks costs 1024 small steps. Owned by the
// controller's thread.

#include <trainrun/result.h>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "controller/report_barrier.h"

namespace trainrun {

class ReportCoordinator {
 public:
  /// `iteration_offset`: the reports that earlier runs of this name recorded,
  /// which the iterations recorded here continue.
  ReportCoordinator(int world_size, int64_t iteration_offset);

  /// A rank reports `iteration` (1-based, counted by the rank). Returns the
  /// usage error when it is out of step.
  std::optional<std::string> arrive(int rank, int64_t iteration, nlohmann::json metrics);
  /// A rank reached report `iteration` and waits for every rank to reach it
  /// (nothing is recorded). Returns the usage error when it is out of step.
  std::optional<std::string> arrive_early(int rank, int64_t iteration);
  /// Whether every rank has reached the current report's arrival; then
  /// release_early() lets them go on to the report itself.
  bool early_complete() const { return early_count_ == world_size_; }
  void release_early();
  /// Whether every rank has reported the current iteration.
  bool complete() const { return barrier_.complete(); }
  /// Whether some ranks wait in the current report, or before it, for others
  /// that have not reached it.
  bool partly_arrived() const {
    return (barrier_.arrived() > 0 && !barrier_.complete()) ||
           (early_count_ > 0 && early_count_ < world_size_);
  }
  /// The iteration being collected, as the ranks count it.
  int64_t iteration() const { return barrier_.iteration(); }
  /// Whether `rank` waits for the others: in the current report or before it.
  bool waiting(int rank) const {
    return barrier_.waiting(rank) || early_[static_cast<size_t>(rank)];
  }
  /// Ends the completed report and starts the next: its record (rank 0's
  /// metrics; the iteration continues earlier runs), without times or a
  /// checkpoint yet.
  ReportRecord release();

  /// A rank returned from train_func; it must not be waiting.
  void finished(int rank);
  /// A rank left the group while the others went on (in-place recovery): no
  /// report waits for it. Then early_complete() or complete() may hold.
  void depart(int rank);
  /// A rank back in the group (a replacement that joined between reports):
  /// the next report waits for it too.
  void rejoin(int rank);
  /// Whether some rank waits before the current report (ARRIVE).
  bool any_early() const { return early_count_ > 0; }
  /// A rank that returns while others wait in report would leave them waiting
  /// forever: when every rank has either returned or is waiting, and both
  /// kinds exist, the rank to blame and the usage error.
  std::optional<std::pair<int, std::string>> stalled() const;

 private:
  ReportBarrier barrier_;
  std::vector<bool> early_;  // by rank: arrived before the current report
  int early_count_ = 0;
  int world_size_;
  int64_t iteration_offset_;
  int finished_ = 0;
  int last_finished_ = -1;
};

}  // namespace trainrun
