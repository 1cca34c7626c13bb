#include "controller/failure.h"

#include <trainrun/error.h>

#include <algorithm>

namespace trainrun {
namespace {

// Lower is more likely the cause.
int precedence(FailureKind kind) {
  switch (kind) {
    case FailureKind::kInterrupted: return 0;
    case FailureKind::kSignal:
    case FailureKind::kExit: return 1;
    case FailureKind::kLost: return 2;
    default: return 3;  // exception, plugin, setup, usage, storage
  }
}

}  // namespace

void FailureCollector::add(RunError error, Clock::time_point when) {
  errors_.push_back({std::move(error), when});
}

bool FailureCollector::settled(Clock::time_point now, Clock::duration grace) const {
  if (!any()) return false;
  // A process that died is the root cause at once: nothing arriving later
  // (its peers' errors, a lost heartbeat) outranks it or came before it.
  if (precedence(root_cause().kind) <= precedence(FailureKind::kExit)) return true;
  return now - errors_.front().when >= grace;
}

RunError FailureCollector::root_cause() const {
  TRAINRUN_CHECK(any(), "root_cause() without a failure");
  auto best = std::min_element(errors_.begin(), errors_.end(), [](const auto& a, const auto& b) {
    return precedence(a.error.kind) < precedence(b.error.kind);
  });
  return best->error;  // min_element keeps the earliest among equals
}

}  // namespace trainrun
