#include "controller/report_coordinator.h"

#include <trainrun/error.h>

namespace trainrun {

ReportCoordinator::ReportCoordinator(int world_size, int64_t iteration_offset)
    : barrier_(world_size), world_size_(world_size), iteration_offset_(iteration_offset) {}

std::optional<std::string> ReportCoordinator::arrive(int rank, int64_t iteration,
                                                     nlohmann::json metrics) {
  return barrier_.arrive(rank, iteration, std::move(metrics));
}

ReportRecord ReportCoordinator::release() {
  int64_t iteration = iteration_offset_ + barrier_.iteration();
  return ReportRecord{iteration, 0, 0, barrier_.release(), ""};
}

void ReportCoordinator::finished(int rank) {
  TRAINRUN_CHECK(!barrier_.waiting(rank), "a rank finished while waiting in a report");
  ++finished_;
  last_finished_ = rank;
}

std::optional<std::pair<int, std::string>> ReportCoordinator::stalled() const {
  if (finished_ == 0 || barrier_.arrived() == 0 || finished_ + barrier_.arrived() < world_size_) {
    return std::nullopt;  // nobody returned, nobody waits, or someone still trains
  }
  int waiting = 0;
  while (!barrier_.waiting(waiting)) ++waiting;  // one exists: arrived() > 0
  return std::make_pair(
      last_finished_,
      "returned from train_func after " + std::to_string(barrier_.iteration() - 1) +
          " reports while rank " + std::to_string(waiting) + " waits in report " +
          std::to_string(barrier_.iteration()) +
          ": every rank must call train::report the same number of times");
}

}  // namespace trainrun
