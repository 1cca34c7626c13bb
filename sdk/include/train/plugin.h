#pragma once

#include <train/abi.h>
#include <train/config.h>
#include <train/version.h>

#include <torch/version.h>

#include <type_traits>

// A plugin's code and the SDK's library share LibTorch's C++ types: both must
// be built with the same LibTorch (find_package(trainrun) looks for that one
// first, and says so when it finds another).
#if TORCH_VERSION_MAJOR != TRAIN_SDK_TORCH_VERSION_MAJOR || \
    TORCH_VERSION_MINOR != TRAIN_SDK_TORCH_VERSION_MINOR || \
    TORCH_VERSION_PATCH != TRAIN_SDK_TORCH_VERSION_PATCH
#error \
    "this plugin compiles against another LibTorch than the trainrun SDK was built with \
(TRAIN_SDK_TORCH_VERSION in train/version.h): set CMAKE_PREFIX_PATH to that LibTorch"
#endif

namespace train::detail {

using Body = void (*)(const Config&);

/// Adds an entry to this plugin's descriptor; called once per TRAIN_FUNC at load time.
int register_entry(const char* name, train_entry_fn_v1_t fn);

/// Runs `body` with the host table installed; catches every exception.
int run_entry(const train_host_v1_t* host, char* error, size_t error_size, Body body);

template <typename F>
void call(F& fn, const Config& config) {
  if constexpr (std::is_invocable_v<F&, const Config&>) {
    fn(config);
  } else {
    static_assert(std::is_invocable_v<F&>,
                  "TRAIN_FUNC needs void fn(const train::Config&) or void fn()");
    fn();
  }
}

}  // namespace train::detail

/// Exports `fn` as an entry of this plugin under its own name. `fn` is
/// `void fn(const train::Config&)` or `void fn()`. A library may export several;
/// `trainrun --entry NAME` picks one. Use at namespace scope, once per function.
#define TRAIN_FUNC(fn)                                                                       \
  __attribute__((section(TRAIN_PLUGIN_ENTRIES_SECTION),                                      \
                 used)) static const char train_entry_name_##fn[] = #fn;                     \
  static void train_body_##fn(const ::train::Config& config) {                               \
    ::train::detail::call(fn, config);                                                       \
  }                                                                                          \
  static int train_entry_##fn(const train_host_v1_t* host, char* error, size_t error_size) { \
    return ::train::detail::run_entry(host, error, error_size, &train_body_##fn);            \
  }                                                                                          \
  [[maybe_unused]] static const int train_registered_##fn =                                  \
      ::train::detail::register_entry(train_entry_name_##fn, &train_entry_##fn)
