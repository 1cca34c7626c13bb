#include "controller/report_barrier.h"

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
  if (rank == 0) rank0_metrics_ = std::move(metrics);
  return std::nullopt;
}

bool ReportBarrier::complete() const { return arrived_ == static_cast<int>(waiting_.size()); }

nlohmann::json ReportBarrier::release() {
  std::fill(waiting_.begin(), waiting_.end(), false);
  arrived_ = 0;
  ++iteration_;
  return std::exchange(rank0_metrics_, nullptr);
}

}  // namespace trainrun
