#pragma once

// Lets at most `burst` events a period through and counts the rest, so that a
// flood (200,000 junk messages from a peer) costs a few log lines rather than
// one each. Pure; one owner.

#include <chrono>

namespace trainrun {

class RateLimiter {
 public:
  using Clock = std::chrono::steady_clock;

  RateLimiter(int burst, Clock::duration period) : burst_(burst), period_(period) {}

  /// Whether the event at `now` may pass; one that may not is counted.
  bool allow(Clock::time_point now) {
    if (now - start_ >= period_) {
      start_ = now;
      passed_ = 0;
    }
    if (passed_ < burst_) {
      ++passed_;
      return true;
    }
    ++suppressed_;
    return false;
  }
  /// How many events were held back since the last call.
  int take_suppressed() {
    int n = suppressed_;
    suppressed_ = 0;
    return n;
  }

 private:
  int burst_;
  Clock::duration period_;
  Clock::time_point start_{};
  int passed_ = 0;
  int suppressed_ = 0;
};

}  // namespace trainrun
