#include "common/crash_report.h"

#include <cctype>
#include <cstring>

namespace trainrun {

void CrashReport::take(std::string_view line) {
  if (line.substr(0, kCrashHeader.size()) == kCrashHeader) {
    frames_.clear();  // the last crash is the one that counts
    signal_ = line.substr(kCrashHeader.size(), kMaxFrameText);
    return;
  }
  if (signal_.empty() || line.substr(0, kCrashFrame.size()) != kCrashFrame ||
      frames_.size() >= kMaxFrames) {
    return;
  }
  // "#12 f at x.cpp:4": the number goes, the frame stays.
  line.remove_prefix(kCrashFrame.size());
  while (!line.empty() && std::isdigit(static_cast<unsigned char>(line.front()))) {
    line.remove_prefix(1);
  }
  while (!line.empty() && line.front() == ' ') line.remove_prefix(1);
  frames_.emplace_back(line.substr(0, kMaxFrameText));
}

namespace {

// The C and C++ runtimes' own frames (raise, abort, __cxa_throw's helpers):
// where they are is not where the user's code went wrong.
bool in_system_runtime(const std::string& frame) {
  static const char* const kLibraries[] = {"libc.so",  "libstdc++.so",  "libgcc_s.so",
                                           "ld-linux", "libpthread.so", "libm.so"};
  auto in = frame.rfind(" in ");
  std::string_view module =
      in == std::string::npos ? std::string_view(frame) : std::string_view(frame).substr(in + 4);
  for (const char* library : kLibraries) {
    if (module.substr(0, std::strlen(library)) == library) return true;
  }
  return false;
}

}  // namespace

std::vector<std::string> CrashReport::frames_of(std::string_view signal) const {
  const bool named = !signal.empty() && signal_.size() > signal.size() &&
                     signal_.compare(0, signal.size(), signal) == 0 &&
                     signal_[signal.size()] == ' ';
  return named ? frames_ : std::vector<std::string>{};
}

std::string innermost_place(const std::vector<std::string>& frames, std::string_view library) {
  // The plugin's own frames first: a check that failed, or a fault, inside
  // LibTorch was reached from there.
  if (!library.empty()) {
    std::vector<std::string> own;
    for (const auto& frame : frames) {
      const auto in = frame.rfind(" in ");
      const auto plus = frame.rfind('+');
      if ((in != std::string::npos && std::string_view(frame).substr(in + 4) == library) ||
          (in == std::string::npos && plus != std::string::npos &&
           std::string_view(frame).substr(0, plus) == library)) {
        own.push_back(frame);
      }
    }
    if (!own.empty()) return innermost_place(own);
  }
  const std::string* first = nullptr;  // the innermost frame outside the runtimes
  for (const auto& frame : frames) {
    if (in_system_runtime(frame)) continue;
    if (first == nullptr) first = &frame;
    auto at = frame.rfind(" at ");
    if (at == std::string::npos) continue;
    // The function, and the file without its directories or its library.
    auto function = frame.substr(0, std::min<size_t>(at, 160));
    auto file = frame.substr(at + 4);
    if (auto in = file.rfind(" in "); in != std::string::npos) file.erase(in);
    if (auto slash = file.rfind('/'); slash != std::string::npos) file.erase(0, slash + 1);
    return "in " + function + " at " + file;
  }
  if (frames.empty()) return {};
  return "in " + (first != nullptr ? *first : frames.front()).substr(0, 160);
}

}  // namespace trainrun
