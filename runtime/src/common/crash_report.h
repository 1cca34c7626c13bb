#pragma once

// How a dying worker tells the controller where it died: the lines its fatal
// signal handler writes to stderr (worker/stacks.h), which reach the
// controller through the worker's pipe or its node agent, and which the
// controller picks out of the output (CrashReport) for the root cause. Also
// the one-line place a stack names ("in f at file.cpp:12"), for crashes and
// throws alike.

#include <string>
#include <string_view>
#include <vector>

namespace trainrun {

/// The first line of a crash's stack; the signal's description follows it
/// ("SIGSEGV (Segmentation fault) in thread 12 ... of process 10, its stack:").
constexpr std::string_view kCrashHeader = "trainrun: fatal signal ";
/// The start of each frame's line, before its number: "trainrun:   #3 f at x.cpp:4".
constexpr std::string_view kCrashFrame = "trainrun:   #";
/// The frames a stack keeps, and the characters a frame keeps.
constexpr size_t kMaxFrames = 64;
constexpr size_t kMaxFrameText = 512;

/// The last crash's frames in a worker's output, fed one line at a time: the
/// frame lines after the last header, whatever else the worker's other
/// threads write between them.
class CrashReport {
 public:
  void take(std::string_view line);
  /// The frames, innermost first, when the last header names `signal` (as
  /// signal_description() says it: "SIGSEGV (Segmentation fault)"): those of
  /// another death (a child's, an earlier crash's) are not this one's.
  std::vector<std::string> frames_of(std::string_view signal) const;

 private:
  std::vector<std::string> frames_;
  std::string signal_;  // what the last header says after kCrashHeader
};

/// Where a stack points, for a one-line message: the innermost frame outside
/// the C and C++ runtimes with a source line ("in crash_here() at
/// plug.cpp:12"), else the innermost one outside them ("in crash_here() in
/// libplug.so"); empty for no frames. Frames read as worker/stacks.h writes
/// them: "f() at /src/plug.cpp:12 in libplug.so". With `library` (the
/// plugin's file name), the same among its own frames where it has any: a
/// fault or a failed check inside LibTorch is named where the plugin called it.
std::string innermost_place(const std::vector<std::string>& frames, std::string_view library = {});

}  // namespace trainrun
