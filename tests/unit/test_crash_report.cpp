#include <doctest/doctest.h>

#include "common/crash_report.h"

using trainrun::CrashReport;
using trainrun::innermost_place;

TEST_CASE("a crash report is read out of a worker's output, the last one counting") {
  const std::string segv = "SIGSEGV (Segmentation fault)";
  CrashReport report;
  report.take("ordinary output");
  report.take("trainrun:   #0 not after a header");
  CHECK(report.frames_of(segv).empty());
  report.take("trainrun: fatal signal " + segv + " in thread 7 of process 7, its stack:");
  report.take("trainrun:   #0 f(int) at /src/a.cpp:3 in libp.so");
  report.take("another thread's output, between the frames");
  report.take("trainrun:   #1 g() in libp.so");
  const std::vector<std::string> both{"f(int) at /src/a.cpp:3 in libp.so", "g() in libp.so"};
  CHECK(report.frames_of(segv) == both);
  // Only for the signal that ended the process.
  CHECK(report.frames_of("SIGKILL (Killed)").empty());
  CHECK(report.frames_of("SIGSEG").empty());
  // A second header (the unsymbolized fallback) starts again.
  report.take("trainrun: fatal signal " + segv +
              " in thread 7 of process 7 (not symbolized), "
              "its stack:");
  report.take("trainrun:   #0 0x1234");
  CHECK(report.frames_of(segv) == std::vector<std::string>{"0x1234"});
}

TEST_CASE("a crash report keeps a bounded number of bounded frames") {
  CrashReport report;
  report.take("trainrun: fatal signal SIGABRT (Aborted) in thread 1 of process 1, its stack:");
  for (int i = 0; i < 200; ++i) report.take("trainrun:   #1 " + std::string(2000, 'x'));
  const auto frames = report.frames_of("SIGABRT (Aborted)");
  CHECK(frames.size() == trainrun::kMaxFrames);
  CHECK(frames[0].size() == trainrun::kMaxFrameText);
}

TEST_CASE("the innermost place skips the C and C++ runtimes and prefers a source line") {
  CHECK(innermost_place({}).empty());
  CHECK(innermost_place({"__pthread_kill_implementation at ./nptl/pthread_kill.c:44 in libc.so.6",
                         "abort at ./stdlib/abort.c:79 in libc.so.6",
                         "crash(train::Config const&) at ../tests/p.cpp:12 in libp.so",
                         "main at m.cpp:1 in trainrun-worker"}) ==
        "in crash(train::Config const&) at p.cpp:12");
  // Without debug information: the innermost frame outside the runtimes.
  CHECK(innermost_place({"raise in libc.so.6", "step() in libp.so", "libp.so+0x10"}) ==
        "in step() in libp.so");
  // The plugin's own frames first, with the plugin's name: where its code
  // called the library that failed.
  const std::vector<std::string> torch_check{
      "c10::detail::torchCheckFail(char const*) at c10/util/Exception.cpp:87 in libc10.so",
      "at::native::add(at::Tensor const&) in libtorch_cpu.so", "step(int) in libp.so",
      "train(train::Config const&) at /src/p.cpp:9 in libp.so"};
  CHECK(innermost_place(torch_check) ==
        "in c10::detail::torchCheckFail(char const*) at Exception.cpp:87");
  CHECK(innermost_place(torch_check, "libp.so") == "in train(train::Config const&) at p.cpp:9");
  CHECK(innermost_place({"libp.so+0x10", "f() in libq.so"}, "libp.so") == "in libp.so+0x10");
  CHECK(innermost_place({"f() in libq.so"}, "libp.so") == "in f() in libq.so");
  // Nothing but the runtimes: the innermost frame.
  CHECK(innermost_place({"abort in libc.so.6"}) == "in abort in libc.so.6");
}
