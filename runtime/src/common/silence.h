#pragma once

// How long a peer has been silent, for the loops that judge it lost (a node
// agent's and a worker's judgement of the controller). Time this process
// itself did not run does not count: stopped (SIGSTOP, a frozen VM) or
// starved, it could not read what the peer sent meanwhile, which may still be
// on its way in through ZeroMQ's I/O thread. A pass of the loop far longer
// than its wait is such a stall; the peer's silence then counts from its end.

#include <chrono>

namespace trainrun {

class Silence {
 public:
  using Clock = std::chrono::steady_clock;
  /// A pass longer than this was a stall: the loops wait 100 ms at most.
  static constexpr std::chrono::seconds kStall{2};

  explicit Silence(Clock::time_point now = Clock::now()) : heard_(now), pass_(now) {}

  void heard(Clock::time_point now) { heard_ = now; }

  /// The peer's silence at `now`, called once per pass of the loop; true in
  /// `stalled` when the pass before it was a stall.
  Clock::duration at(Clock::time_point now, bool* stalled = nullptr) {
    const bool stall = now - pass_ > kStall;
    if (stall && heard_ < now) heard_ = now;
    if (stalled != nullptr) *stalled = stall;
    pass_ = now;
    return now - heard_;
  }

 private:
  Clock::time_point heard_;
  Clock::time_point pass_;
};

}  // namespace trainrun
