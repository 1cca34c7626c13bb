#pragma once

// `trainrun stacks RUN_DIR`: every thread's stack of every worker of a live
// run. It signals the run's controller (SIGUSR1; the pid is in the run's
// .lock), which asks each worker and writes logs/stacks-<n>.txt, and prints
// that file.

#include <chrono>
#include <filesystem>

namespace trainrun {

/// Prints the stacks once the controller wrote them; returns the exit code
/// (1 when none came within `wait`). Throws UsageError when no run is live
/// there, or its controller is on another host or cannot be asked.
int print_stacks(const std::filesystem::path& run_dir, std::chrono::milliseconds wait);

}  // namespace trainrun
