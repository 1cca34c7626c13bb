#pragma once

// Where a loop reads the time. The controller takes it as a TimeSource so that
// a test can drive it with a clock of its own: a heartbeat timeout, a failure's
// grace period or a back-off then passes when the test moves the clock, in
// microseconds, not in seconds of waiting. Everything else reads the steady
// clock (and the run's records the system clock: unix_time). A TimeSource's
// now() may be called from any thread.

#include <chrono>

namespace trainrun {

using Clock = std::chrono::steady_clock;

class TimeSource {
 public:
  virtual ~TimeSource() = default;
  /// The time now.
  virtual Clock::time_point now() const = 0;
  /// How long a loop that wants to wait `wanted` for its descriptors may block:
  /// all of it on the steady clock. A test's clock, which moves only when told,
  /// keeps each wait short, so that the loop sees the move soon after it.
  virtual std::chrono::milliseconds longest_wait(std::chrono::milliseconds wanted) const {
    return wanted;
  }
};

/// Seconds since the epoch, as the run's records write times.
inline double unix_time() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

/// The steady clock as a TimeSource.
inline const TimeSource& steady_time() {
  struct Steady final : TimeSource {
    Clock::time_point now() const override { return Clock::now(); }
  };
  static const Steady steady;
  return steady;
}

}  // namespace trainrun
