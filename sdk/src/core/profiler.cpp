#include "core/profiler.h"

#include <train/data.h>
#include <train/torch_compat.h>

#include <torch/torch.h>
#if TORCH_VERSION_MAJOR >= 2
#include <torch/csrc/autograd/profiler_kineto.h>
#else
#include <torch/csrc/autograd/profiler_legacy.h>
#endif

#include <atomic>
#include <filesystem>
#include <iostream>
#include <memory>

#include "core/host.h"

namespace train::detail {
namespace {

namespace profiler = torch::autograd::profiler;

// One running entry's profile. The SDK is linked into each plugin: one per plugin.
struct Profile {
  uint64_t entry = 0;  // the entry_serial it belongs to
  std::atomic<int64_t> steps{0};
  bool running = false;
  bool done = false;
  std::string path;
#if TORCH_VERSION_MAJOR < 2
  std::unique_ptr<profiler::RecordProfile> legacy;
#endif
};

Profile& profile() {
  static Profile state;
  return state;
}

void start(Profile& state) {
#if TORCH_VERSION_MAJOR >= 2
  using torch::profiler::impl::ActivityType;
  const torch::profiler::impl::ProfilerConfig config(torch::profiler::impl::ProfilerState::KINETO);
  std::set<ActivityType> activities{ActivityType::CPU};
  if (torch::cuda::is_available()) activities.insert(ActivityType::CUDA);
  profiler::prepareProfiler(config, activities);
  profiler::enableProfiler(config, activities);
#else
  state.legacy = std::make_unique<profiler::RecordProfile>(state.path);  // writes at its end
#endif
  state.running = true;
}

void stop(Profile& state) {
  if (!state.running) return;
  state.running = false;
  state.done = true;
#if TORCH_VERSION_MAJOR >= 2
  profiler::disableProfiler()->save(state.path);
#else
  state.legacy.reset();
#endif
}

}  // namespace

void backward_done() { ++profile().steps; }

void profile_point() {
  const auto* host = entry_host_on_this_thread();
  if (host == nullptr || !TRAIN_HOST_HAS(host, profile_path) || host->profile_first <= 0 ||
      host->profile_path == nullptr) {
    return;
  }
  auto& state = profile();
  if (state.entry != entry_serial()) {  // the first point of this train function
    state.entry = entry_serial();
    state.steps = 0;
    state.running = state.done = false;
    state.path = host->profile_path;
    at_entry_end([] {
      try {
        stop(profile());
      } catch (const std::exception& e) {  // a profile is never worth failing the run
        std::cerr << "trainrun: the profile was not written: " << e.what() << std::endl;
      }
    });
  }
  if (state.done) return;
  const int64_t steps = state.steps;
  try {
    // From the end of step first - 1 to the end of step last.
    if (!state.running && steps >= host->profile_first - 1 && steps < host->profile_last) {
      std::filesystem::create_directories(std::filesystem::path(state.path).parent_path());
      start(state);
    } else if (state.running && steps >= host->profile_last) {
      stop(state);
    }
  } catch (const std::exception& e) {
    state.running = false;
    state.done = true;
    std::cerr << "trainrun: the profile was not written: " << e.what() << std::endl;
  }
}

}  // namespace train::detail
