#pragma once

// Whether a train::CapturedStep on this thread is capturing its step now: the
// SDK's parts that keep state on the host (train::Metric) refuse to be
// updated there, since a replay would not update them, and GradScaler knows
// that what a capture that failed left undone is to be done again.

namespace train::detail {

bool capturing_step();
/// Set by CapturedStep around the step function's run under capture.
void set_capturing_step(bool capturing);

}  // namespace train::detail
