#pragma once

// Test-only crash injection. When the environment variable TRAINRUN_CRASH_POINT
// names a point ("commit:renamed", or "commit:state@2" for the second time it
// is reached), the process ends there at once with _exit(86), as kill -9 would
// end it: no destructor, no flush. Tests use it to prove that a run
// recovers from a crash between any two steps of a commit. With
// TRAINRUN_CRASH_ONCE=<path> as well, only the process that creates that file
// crashes, so that a restarted process passes the point. Costs one getenv per
// process.

namespace trainrun {

inline constexpr int kCrashPointExitCode = 86;

/// Ends the process here if TRAINRUN_CRASH_POINT chooses `point` (and this is
/// the chosen time). Not thread-safe: one thread reaches crash points.
void crash_point(const char* point);

}  // namespace trainrun
