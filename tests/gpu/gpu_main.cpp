// The GPU tests' main. Where no CUDA device is visible every test case is
// skipped (gpu_skip.h), never passed: these tests run only where they can.
// Listing the cases, which doctest_discover_tests does at build time, works
// on any machine.

#include <torch/cuda.h>
#include <torch/version.h>

#include <cstdio>
#include <cstring>

#define DOCTEST_CONFIG_IMPLEMENT
#include "common/torch_line.h"
#include "doctest_torch.h"
#include "gpu_skip.h"
#include "process_ranks.h"

// Counted in a child: the tests that fork ranks need this process without a
// CUDA context (process_ranks.h).
int cuda_devices() {
  static const int count = process_ranks::count_cuda_devices(
      [] { return static_cast<int>(torch::cuda::device_count()); });
  return count;
}

int main(int argc, char** argv) {
  bool listing = false;
  for (int i = 1; i < argc; ++i) listing = listing || std::strncmp(argv[i], "--list", 6) == 0;
  if (!listing) {
    try {
      cuda_devices();
    } catch (const std::exception& e) {  // a failed count must not read as "no GPU"
      std::fprintf(stderr, "counting the CUDA devices failed: %s\n", e.what());
      return 1;
    }
  }
  if (!listing && cuda_devices() == 0) {
    skip(std::string("no CUDA device here (LibTorch ") + TORCH_VERSION +
         (TRAINRUN_WITH_CUDA ? ", built with CUDA)" : ", CPU only)"));
  }
  doctest::Context context(argc, argv);
  return context.run();
}
