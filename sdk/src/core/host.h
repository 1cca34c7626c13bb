#pragma once

// The host table of the running entry. One per plugin: the SDK is linked
// statically into each plugin with hidden visibility, so every plugin has its
// own copy of this state. Set by run_entry for the duration of the call.

#include <train/abi.h>
#include <train/report.h>

#include <cstdint>
#include <functional>
#include <thread>

namespace train::detail {

/// The host table of the entry being run; throws std::logic_error outside one.
const train_host_v1_t& current_host(const char* caller);

/// The host table of the entry being run, or nullptr outside one.
const train_host_v1_t* current_host_or_null();

/// The same, but nullptr on any thread other than the entry's own.
const train_host_v1_t* entry_host_on_this_thread();

/// Which entry runs: a new number for each, so that state of one train
/// function is never taken for the next one's.
uint64_t entry_serial();

/// Runs `cleanup` when the running entry returns (before its HostScope ends):
/// state tied to one train function, such as prepared models, goes with it.
void at_entry_end(std::function<void()> cleanup);

/// train::report's body: `checkpoint_dir` is NULL for a report without one;
/// `upload_mode` is TRAIN_UPLOAD_SYNC or TRAIN_UPLOAD_ASYNC.
void report_with(const Metrics& metrics, const char* checkpoint_dir,
                 uint32_t upload_mode = TRAIN_UPLOAD_SYNC);

/// Installs `host` for the lifetime of the guard.
class HostScope {
 public:
  explicit HostScope(const train_host_v1_t* host);
  ~HostScope();
  HostScope(const HostScope&) = delete;
  HostScope& operator=(const HostScope&) = delete;

 private:
  const train_host_v1_t* previous_;
  std::thread::id previous_thread_;
};

}  // namespace train::detail
