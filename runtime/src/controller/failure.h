#pragma once

// Collects failures as they arrive and names the root cause. A crash on one
// rank makes its peers' collectives fail a moment later, so after the first
// failure the controller keeps collecting for a short grace period and then
// prefers a process that died over a rank that raised, and the earliest within
// each kind.

#include <trainrun/result.h>

#include <chrono>
#include <optional>
#include <vector>

namespace trainrun {

class FailureCollector {
 public:
  using Clock = std::chrono::steady_clock;

  /// A failure that arrived at `when`.
  void add(RunError error, Clock::time_point when);
  bool any() const { return !errors_.empty(); }
  /// Whether the root cause is known: a process died (nothing later outranks
  /// it), or the grace period after the first failure is over.
  bool settled(Clock::time_point now, Clock::duration grace) const;
  /// When the first failure arrived; requires any().
  Clock::time_point first() const { return errors_.front().when; }
  /// The root cause; requires any().
  RunError root_cause() const;

 private:
  struct Entry {
    RunError error;
    Clock::time_point when;
  };
  std::vector<Entry> errors_;
};

}  // namespace trainrun
