#pragma once

// The host table of the running entry. One per plugin: the SDK is linked
// statically into each plugin with hidden visibility, so every plugin has its
// own copy of this state. Set by run_entry for the duration of the call.

#include <train/abi.h>

namespace train::detail {

/// The host table of the entry being run; throws std::logic_error outside one.
const train_host_v1_t& current_host(const char* caller);

/// Installs `host` for the lifetime of the guard.
class HostScope {
 public:
  explicit HostScope(const train_host_v1_t* host);
  ~HostScope();
  HostScope(const HostScope&) = delete;
  HostScope& operator=(const HostScope&) = delete;

 private:
  const train_host_v1_t* previous_;
};

}  // namespace train::detail
