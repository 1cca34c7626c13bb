#include "common/parent.h"

#include <sys/prctl.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <string>

namespace trainrun {

void die_with_parent() {
  const char* parent = std::getenv(kParentPidVariable);
  if (parent == nullptr) return;
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  // The controller may have died before the prctl: then this process was
  // handed to another parent already, and no signal will come.
  if (std::to_string(::getppid()) != parent) {
    const char message[] = "trainrun: the controller that started this worker is gone\n";
    [[maybe_unused]] auto n = ::write(STDERR_FILENO, message, sizeof(message) - 1);
    ::_exit(127);
  }
  ::unsetenv(kParentPidVariable);  // not for the train function's own children
}

}  // namespace trainrun
