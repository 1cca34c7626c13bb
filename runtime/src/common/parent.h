#pragma once

// A process started by a trainrun controller or node agent dies with it: the
// parent names itself in the child's environment, and the child asks the
// kernel for SIGKILL when its parent ends (PR_SET_PDEATHSIG), which
// posix_spawn cannot ask for it.

namespace trainrun {

/// The environment variable that carries the parent's pid.
inline constexpr const char* kParentPidVariable = "TRAINRUN_CONTROLLER_PID";

/// When started by a controller or agent: SIGKILL when it dies, and an
/// immediate exit (code 127) when it is already gone; returns true. Does
/// nothing and returns false otherwise.
bool die_with_parent();

}  // namespace trainrun
