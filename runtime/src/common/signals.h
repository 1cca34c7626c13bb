#pragma once

// SIGINT, SIGTERM, SIGHUP, SIGCHLD and SIGUSR1 (every rank's stacks) turned into bytes on a pipe
// (the self-pipe trick), so the controller's single poll loop sees them beside its sockets; they
// are unblocked on the constructing thread, and SIGPIPE is ignored. One live instance per process
// (the constructor throws UsageError for a second); the previous handlers and mask are restored on
// destruction.

#include <csignal>
#include <optional>
#include <string>
#include <vector>

#include "common/fd.h"

namespace trainrun {

class SignalPipe {
 public:
  SignalPipe();
  ~SignalPipe();
  SignalPipe(const SignalPipe&) = delete;
  SignalPipe& operator=(const SignalPipe&) = delete;

  /// Readable when a signal arrived.
  int fd() const { return read_fd_.get(); }
  /// The signals that arrived since the last call.
  std::vector<int> drain();

 private:
  Fd read_fd_;
  Fd write_fd_;  // the handler writes to it through a global int, cleared before this closes
  struct sigaction previous_[5];
  struct sigaction previous_pipe_;
  sigset_t previous_mask_;
};

/// "SIGSEGV (Segmentation fault)".
std::string signal_description(int signal);
/// How a process ended: "exited with code 3" (a code), or "was killed by
/// SIGSEGV (Segmentation fault)" (no code: the signal).
std::string exit_description(std::optional<int> code, int signal);

}  // namespace trainrun
