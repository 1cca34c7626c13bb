#pragma once

// The in-process worker (`trainrun --local`, ScalingConfig::in_process): the
// worker's code, LibTorch with it, in a module that the controller loads into
// its own process only for such a run, so that `trainrun` itself never links
// LibTorch. The controller runs the module's entry on a thread of its own; it
// connects back to the controller over loopback like any local worker, and
// runs the train function on a thread of this process, where a debugger or a
// sanitizer sees it.
//
// The module and the controller are built together, but a module left over
// from another build may be found: the entry's name carries the version of
// this table, fields are only ever appended, and struct_size says how much of
// it the caller filled.

#include <cstddef>
#include <cstdint>
#include <filesystem>

extern "C" {

typedef struct trainrun_in_process_v1 {
  uint32_t struct_size;
  const char* connect;            // the controller's ROUTER endpoint
  const char* secret;             // the run's worker secret
  const char* cache_dir;          // the plugin cache
  int64_t startup_timeout_ms;     // waiting for ASSIGN
  const char* helper_executable;  // trainrun-worker, which walks this process's stacks
  const char* plugin;             // the user's plugin file, loaded in place when unchanged
  int stop_fd;  // readable when the controller stops the worker (its SIGTERM): the worker ends
  // Out: the train function had not returned when the worker stopped (a run
  // interrupted or failed with it inside); its thread goes on.
  int train_left_running;
} trainrun_in_process_v1;

/// Runs the worker until the controller says SHUTDOWN or writes stop_fd;
/// returns its exit code.
typedef int (*trainrun_in_process_fn_v1)(trainrun_in_process_v1* args);
}

namespace trainrun {

/// The entry's symbol in the module.
inline constexpr const char* kInProcessEntry = "trainrun_in_process_worker_v1";
/// The module's file name.
inline constexpr const char* kInProcessModule = "trainrun-in-process.so";

/// The module: beside `worker_executable` (a build tree), else in its
/// prefix's lib/trainrun/ (installed). Throws UsageError when there is none.
std::filesystem::path find_in_process_module(const std::filesystem::path& worker_executable);

}  // namespace trainrun
