#pragma once

// Stacks of a worker's threads, symbolized with Boost.Stacktrace (libbacktrace:
// function, file and line where the plugin has debug info; the library and
// offset where it has none):
//
//  - a crash: a fatal signal's handler writes the faulting thread's stack to
//    stderr in the lines of common/crash_report.h, which the controller reads
//    into the root cause; it symbolizes in a child process it forks, bounded
//    in time, so that a crash inside malloc cannot hang the dying worker;
//  - a throw: every throw in the process records where it was thrown (the
//    process's own __cxa_throw, which calls the C++ runtime's); the train
//    thread reads the last one when the train function raised;
//  - on request: a child process stops every thread of the worker with ptrace
//    (as gdb and eu-stack do) and walks its frames with elfutils' libdw; no
//    thread sees a signal, so no wait of the train function is cut short.
//
// Install once, from the main thread, before any other thread exists.

#include <chrono>
#include <string>
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

/// Forgets the calling thread's last throw: what is thrown after this counts.
void forget_last_throw();
/// Where the calling thread's last exception was thrown, innermost first;
/// empty when nothing was thrown since forget_last_throw().
std::vector<std::string> last_throw();

/// Every thread's stack, this one's included; those the walk did not reach
/// within `bound` are listed with answered = false (all of them where ptrace
/// is not allowed).
std::vector<ThreadStack> all_threads(std::chrono::milliseconds bound);

/// Marks the calling thread as the one that runs the train function.
void mark_train_thread();

}  // namespace trainrun::stacks
