#include "common/crash_point.h"

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
  if (++reached == nth) ::_exit(kCrashPointExitCode);
}

}  // namespace trainrun
