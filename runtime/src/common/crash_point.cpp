#include "common/crash_point.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

namespace trainrun {

void crash_point(const char* point) {
  // "name" or "name@N": the N-th time the point is reached (1-based).
  static const std::string chosen = [] {
    const char* value = std::getenv("TRAINRUN_CRASH_POINT");
    return std::string(value != nullptr ? value : "");
  }();
  static long reached = 0;
  if (chosen.empty()) return;
  auto at = chosen.find('@');
  if (chosen.substr(0, at) != point) return;
  long nth = at == std::string::npos ? 1 : std::atol(chosen.c_str() + at + 1);
  if (++reached != nth) return;
  // With TRAINRUN_CRASH_ONCE, only the process that makes that file crashes:
  // a restarted one passes the point.
  const char* once = std::getenv("TRAINRUN_CRASH_ONCE");
  if (once != nullptr && *once != '\0') {
    int fd = ::open(once, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) return;
    ::close(fd);
  }
  ::_exit(kCrashPointExitCode);
}

}  // namespace trainrun
