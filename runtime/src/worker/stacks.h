#pragma once

// Stacks of a worker's threads: function, file and line where the plugin has
// debug information, the library and offset where it has none.
//
//  - A crash: a fatal signal's handler writes the faulting thread's stack to
//    stderr in the lines of common/crash_report.h, which the controller reads
//    into the root cause. Boost.Stacktrace (libbacktrace) symbolizes it in a
//    child the handler forks, within a bound, so that a crash inside malloc
//    cannot hang the dying worker; a second thread's crash waits for the
//    first's report, and the process dies of the first signal.
//  - A throw: every throw on the train thread records where it was thrown
//    (the process's own __cxa_throw, which then calls the C++ runtime's), and
//    the train thread reads it when the train function raised that exception.
//  - On request: a helper process walks every thread with ptrace and libdw
//    (stack_walk.cpp).
//
// install() once, from the main thread, before any other thread exists.

#include <chrono>
#include <string>
#include <utility>
#include <vector>

namespace trainrun::stacks {

/// A thread's stack: its id and name (/proc's comm), the frames from the top
/// ("f(int) at /src/x.cpp:12 in libx.so", or "libx.so+0x1f2"), whether the
/// walk reached it, and whether it runs the train function.
struct ThreadStack {
  int tid = 0;
  std::string name;
  std::vector<std::string> frames;
  bool answered = true;
  bool train = false;
};

/// Installs the fatal signal handlers (SIGSEGV, SIGBUS, SIGFPE, SIGILL,
/// SIGABRT) and gives the calling thread a signal stack.
void install();

/// Gives the calling thread an alternate signal stack, so that its stack's
/// overflow still gets a report. For the threads trainrun starts.
void give_this_thread_a_signal_stack();

/// Frames in the library file `loaded` (the plugin's cached copy, named by
/// its hash) name `shown` (its name where the user built it) instead.
void name_library(const std::string& loaded, const std::string& shown);

/// The names name_library() set: the loaded file's, and the one shown.
const std::pair<std::string, std::string>& library_name();

/// Forgets the calling thread's last throw: what is thrown after this counts.
void forget_last_throw();
/// Where the train thread's last exception was thrown, innermost first, when
/// `message` (its what(), as the plugin passed it on) begins with that
/// exception's what(); empty otherwise, or when nothing was thrown since
/// forget_last_throw().
std::vector<std::string> last_throw(const std::string& message);

/// Every thread's stack, this one's included, walked by a helper process
/// within `bound` (and two seconds more to hand them over); those the walk
/// did not reach are listed with answered = false (all of them where ptrace
/// is not allowed). One walk at a time.
std::vector<ThreadStack> all_threads(std::chrono::milliseconds bound);

/// The helper all_threads() runs: this executable (a worker's) by default;
/// an in-process worker's is trainrun-worker. Call before the first walk.
void set_helper_executable(const std::string& path);

/// The helper's side: `trainrun-worker --walk-stacks PID MS` walks process
/// PID's threads for at most MS milliseconds once a byte arrives on stdin,
/// and writes "T <tid>" and "F <frame>" lines to stdout. Returns its exit code.
int walk_threads_main(int pid, int bound_ms);

/// Marks the calling thread as the one that runs the train function, whose
/// throws are recorded.
void mark_train_thread();
/// The train thread's id; 0 before it started.
int train_thread();

}  // namespace trainrun::stacks
