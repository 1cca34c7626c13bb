#include "controller/report_coordinator.h"

#include <trainrun/error.h>

#include <algorithm>

namespace trainrun {

ReportCoordinator::ReportCoordinator(int world_size, int64_t iteration_offset)
    : barrier_(world_size),
      early_(static_cast<size_t>(world_size), false),
      world_size_(world_size),
      iteration_offset_(iteration_offset) {}

namespace {

std::string without_arrival(int rank, int64_t iteration) {
  return "rank " + std::to_string(rank) + " reported iteration " + std::to_string(iteration) +
         " without waiting for every rank before it, while other ranks do: every rank must "
         "prepare the same models";
}

}  // namespace

std::optional<std::string> ReportCoordinator::arrive_early(int rank, int64_t iteration) {
  if (iteration != barrier_.iteration() || waiting(rank)) {
    return "rank " + std::to_string(rank) + " reached report " + std::to_string(iteration) +
           " while the run is at report " + std::to_string(barrier_.iteration());
  }
  if (barrier_.arrived() > 0) {  // someone already reported this iteration without arriving
    int other = 0;
    while (!barrier_.waiting(other)) ++other;
    return without_arrival(other, iteration);
  }
  early_[static_cast<size_t>(rank)] = true;
  ++early_count_;
  return std::nullopt;
}

void ReportCoordinator::release_early() {
  std::fill(early_.begin(), early_.end(), false);
  early_count_ = 0;
}

std::optional<std::string> ReportCoordinator::arrive(int rank, int64_t iteration,
                                                     nlohmann::json metrics) {
  if (early_count_ > 0 && !early_[static_cast<size_t>(rank)]) {
    return without_arrival(rank, iteration);
  }
  return barrier_.arrive(rank, iteration, std::move(metrics));
}

ReportRecord ReportCoordinator::release() {
  int64_t iteration = iteration_offset_ + barrier_.iteration();
  return ReportRecord{iteration, 0, 0, barrier_.release(), ""};
}

void ReportCoordinator::depart(int rank) {
  barrier_.depart(rank);
  if (early_[static_cast<size_t>(rank)]) {
    early_[static_cast<size_t>(rank)] = false;
    --early_count_;
  }
  --world_size_;
}

void ReportCoordinator::rejoin(int rank) {
  barrier_.rejoin(rank);
  ++world_size_;
}

void ReportCoordinator::finished(int rank) {
  TRAINRUN_CHECK(!waiting(rank), "a rank finished while waiting in a report");
  ++finished_;
  last_finished_ = rank;
}

std::optional<std::pair<int, std::string>> ReportCoordinator::stalled() const {
  const int waiting_ranks = barrier_.arrived() + early_count_;
  if (finished_ == 0 || waiting_ranks == 0 || finished_ + waiting_ranks < world_size_) {
    return std::nullopt;  // nobody returned, nobody waits, or someone still trains
  }
  int waiting = 0;
  while (!this->waiting(waiting)) ++waiting;  // one exists: waiting_ranks > 0
  const int64_t reports = barrier_.iteration() - 1;
  return std::make_pair(last_finished_,
                        "returned from train_func after " + std::to_string(reports) +
                            (reports == 1 ? " report" : " reports") + " while rank " +
                            std::to_string(waiting) + " waits in report " +
                            std::to_string(barrier_.iteration()) +
                            ": every rank must call train::report the same "
                            "number of times");
}

}  // namespace trainrun
