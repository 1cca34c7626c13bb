#pragma once

// Whether a train::CapturedStep on this thread is capturing its step now: the
// SDK's parts that keep state on the host (train::Metric) refuse to be
// updated there, since a replay would not update them.

namespace train::detail {

bool capturing_step();

}  // namespace train::detail
