#include "controller/report_barrier.h"

#include <trainrun/error.h>

#include <algorithm>

namespace trainrun {

std::optional<std::string> ReportBarrier::arrive(int rank, int64_t iteration,
                                                 nlohmann::json metrics) {
  if (iteration != iteration_ || waiting(rank)) {
    return "rank " + std::to_string(rank) + " reported iteration " + std::to_string(iteration) +
           " while the run is at iteration " + std::to_string(iteration_);
  }
  waiting_[static_cast<size_t>(rank)] = true;
  ++arrived_;
  if (!metrics.is_null() && (metrics_rank_ < 0 || rank < metrics_rank_)) {
    metrics_ = std::move(metrics);
    metrics_rank_ = rank;
  }
  return std::nullopt;
}

bool ReportBarrier::complete() const { return arrived_ == expected_; }

nlohmann::json ReportBarrier::release() {
  std::fill(waiting_.begin(), waiting_.end(), false);
  arrived_ = 0;
  ++iteration_;
  metrics_rank_ = -1;
  return std::exchange(metrics_, nullptr);
}

void ReportBarrier::depart(int rank) {
  auto index = static_cast<size_t>(rank);
  if (waiting_[index]) {  // its metrics, if they were kept, still count
    waiting_[index] = false;
    --arrived_;
  }
  --expected_;
}

void ReportBarrier::rejoin(int rank) {
  TRAINRUN_CHECK(!waiting_[static_cast<size_t>(rank)], "a rank rejoined while waiting");
  ++expected_;
}

}  // namespace trainrun
