#pragma once

// Every timeout a user gives or reads is in seconds, fractions allowed: the
// flags of `trainrun` and `trainrun worker`, and the messages that name one.

#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>

namespace trainrun {

/// The longest timeout a flag takes: about 31 years, far from overflowing.
inline constexpr double kMaxTimeoutSeconds = 1e9;

/// "30 s", "0.5 s", "2.25 s": at most three decimals, no trailing zeros.
inline std::string seconds_text(std::chrono::milliseconds duration) {
  char text[32];
  std::snprintf(text, sizeof text, "%.3f", static_cast<double>(duration.count()) / 1000.0);
  std::string number = text;
  number.erase(number.find_last_not_of('0') + 1);
  if (number.back() == '.') number.pop_back();
  return number + " s";
}

/// A flag's seconds, already checked to lie in (0, kMaxTimeoutSeconds], to
/// milliseconds; a positive value rounds up to at least 1 ms.
inline std::chrono::milliseconds from_seconds(double seconds) {
  auto ms = static_cast<int64_t>(std::llround(seconds * 1000.0));
  return std::chrono::milliseconds(ms > 0 ? ms : 1);
}

/// Milliseconds as the seconds a flag takes ("0.25"), to hand on to a child process.
inline std::string seconds_arg(std::chrono::milliseconds duration) {
  auto text = seconds_text(duration);
  return text.substr(0, text.size() - 2);
}

}  // namespace trainrun
