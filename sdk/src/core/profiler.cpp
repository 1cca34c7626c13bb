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
  uint64_t entry = 0;  // the entry_serial whose points set it up
  // Backward passes through prepared models, for the entry `counted` names
  // (counted on any thread).
  std::atomic<uint64_t> counted{0};
  std::atomic<int64_t> backward_passes{0};
  int64_t batches = 0;  // taken from prepared loaders, on the train thread
  int64_t first = 0, last = 0;
  bool running = false;
  bool done = false;
  std::string path;
#if TORCH_VERSION_MAJOR < 2
  std::unique_ptr<profiler::RecordProfile> legacy;
#endif
  // Steps done: backward passes, or batches where there are more of those (one
  // worker prepares no reducer, and a replayed CUDA graph runs no backward).
  int64_t steps() const { return std::max<int64_t>(backward_passes, batches); }
  // Written here, renamed at the end: a trace cut short is never a trace.
  std::string partial() const { return path + ".partial"; }
};

Profile& profile() {
  static Profile state;
  return state;
}

void say(const std::string& line) { std::cerr << "trainrun: " << line << std::endl; }

void start(Profile& state, bool cuda) {
#if TORCH_VERSION_MAJOR >= 2
  using torch::profiler::impl::ActivityType;
  const torch::profiler::impl::ProfilerConfig config(torch::profiler::impl::ProfilerState::KINETO);
  std::set<ActivityType> activities{ActivityType::CPU};
  if (cuda) activities.insert(ActivityType::CUDA);
  profiler::prepareProfiler(config, activities);
  profiler::enableProfiler(config, activities);
#else
  (void)cuda;  // 1.13's legacy profiler: CPU operators
  state.legacy = std::make_unique<profiler::RecordProfile>(state.partial());  // writes at its end
#endif
  state.running = true;
}

// Stops the profiler; `save`: the trace goes to its file, else nowhere.
void stop(Profile& state, bool save) {
  if (!state.running) return;
  state.running = false;
  state.done = true;
#if TORCH_VERSION_MAJOR >= 2
  auto result = profiler::disableProfiler();
  if (save) result->save(state.partial());
#else
  state.legacy.reset();
#endif
  if (save) {
    std::filesystem::rename(state.partial(), state.path);
  } else {
    std::error_code ignored;
    std::filesystem::remove(state.partial(), ignored);
  }
}

// At the entry's end: what was not said by a trace.
void finish() {
  auto& state = profile();
  // An exception on its way out: the failure goes first, the profile nowhere.
  const bool failing = std::uncaught_exceptions() > 0;
  try {
    if (state.running && state.steps() < state.last && !failing) {
      say("the train function ended after step " + std::to_string(state.steps()) +
          ": the profile covers steps " + std::to_string(state.first) + " to its end");
    }
    stop(state, !failing);
    if (!state.done) {
      say("no profile: steps " + std::to_string(state.first) + " to " + std::to_string(state.last) +
          " never began at a point where the profiler starts (a prepared loader's next batch, "
          "train::report); " +
          std::to_string(state.steps()) + " steps were counted");
    }
  } catch (const std::exception& e) {  // a profile is never worth failing the run
    say(std::string("the profile was not written: ") + e.what());
  }
}

}  // namespace

void backward_done() {
  auto& state = profile();
  const uint64_t entry = entry_serial();
  if (state.counted.exchange(entry) != entry) state.backward_passes = 0;
  ++state.backward_passes;
}

void profile_point(bool batch_done) {
  const auto* host = entry_host_on_this_thread();
  if (host == nullptr || !TRAIN_HOST_HAS(host, profile_path) || host->profile_first <= 0 ||
      host->profile_path == nullptr) {
    return;
  }
  auto& state = profile();
  if (state.entry != entry_serial()) {  // the first point of this train function
    state.entry = entry_serial();
    if (state.counted.exchange(state.entry) != state.entry) state.backward_passes = 0;
    state.batches = 0;
    state.first = host->profile_first;
    state.last = host->profile_last;
    state.running = state.done = false;
    state.path = host->profile_path;
    at_entry_end(&finish);
  }
  if (batch_done) ++state.batches;
  if (state.done) return;
  const int64_t steps = state.steps();
  try {
    // From the end of step first - 1 to the end of step last.
    if (!state.running && steps >= state.first - 1 && steps < state.last) {
      std::filesystem::create_directories(std::filesystem::path(state.path).parent_path());
      start(state, c10::Device(host->device).is_cuda());
    } else if (state.running && steps >= state.last) {
      stop(state, /*save=*/true);
    }
  } catch (const std::exception& e) {
    state.running = false;
    state.done = true;
    say(std::string("the profile was not written: ") + e.what());
  }
}

}  // namespace train::detail
