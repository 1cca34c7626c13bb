#include "common/parent.h"

#include <sys/prctl.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <string>

namespace trainrun {
namespace {

// What the controller's death sends a worker that leads its own process group
// (as the controller starts it): the group ends, and with it whatever the
// train function started, which a SIGKILL of the worker alone would orphan.
void end_process_group(int) { ::kill(0, SIGKILL); }

}  // namespace

bool die_with_parent() {
  const char* parent = std::getenv(kParentPidVariable);
  if (parent == nullptr) return false;
  int death_signal = SIGKILL;
  if (::getpgrp() == ::getpid()) {
    struct sigaction action {};
    action.sa_handler = end_process_group;
    sigemptyset(&action.sa_mask);
    if (::sigaction(SIGHUP, &action, nullptr) == 0) death_signal = SIGHUP;
  }
  ::prctl(PR_SET_PDEATHSIG, death_signal);
  // The controller may have died before the prctl: then this process was
  // handed to another parent already, and no signal will come.
  if (std::to_string(::getppid()) != parent) {
    const char message[] = "trainrun: the process that started this worker is gone\n";
    [[maybe_unused]] auto n = ::write(STDERR_FILENO, message, sizeof(message) - 1);
    ::_exit(127);
  }
  ::unsetenv(kParentPidVariable);  // not for the train function's own children
  return true;
}

}  // namespace trainrun
