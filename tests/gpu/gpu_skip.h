#pragma once

// Skipping a GPU test so that CTest says so: the process exits with
// kSkipped, which tests/CMakeLists.txt names as SKIP_RETURN_CODE, after one
// line saying why. CTest runs each test case in a process of its own, so a
// skip ends only that case.

#include <cstdio>
#include <cstdlib>
#include <string>

constexpr int kSkipped = 77;

[[noreturn]] inline void skip(const std::string& reason) {
  std::printf("skipped: %s\n", reason.c_str());
  std::fflush(stdout);
  std::_Exit(kSkipped);
}

/// The CUDA devices this process sees (0 with a CPU-only LibTorch).
int cuda_devices();

inline void skip_unless_gpus(int needed) {
  const int found = cuda_devices();
  if (found < needed) {
    skip("needs " + std::to_string(needed) + " CUDA device(s), this machine has " +
         std::to_string(found));
  }
}
