// The plugin's exported descriptor, its pointer-free twin in the
// .trainrun_info section, and the entry shim. The descriptor is the only symbol
// a plugin exports; TRAIN_FUNC's registrations fill its entry table while the
// library's static constructors run, before dlopen returns.

#include <train/plugin.h>
#include <train/version.h>

#include <c10/util/Exception.h>
#include <torch/csrc/api/include/torch/version.h>

#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "core/host.h"

extern "C" {
__attribute__((section(TRAIN_PLUGIN_INFO_SECTION), used))
const train_plugin_info_v1_t train_plugin_info_v1 = {
    {'T', 'R', 'A', 'I', 'N', 'R', 'U', 'N'},
    TRAIN_PLUGIN_ABI_VERSION,
    sizeof(train_plugin_info_v1_t),
    _GLIBCXX_USE_CXX11_ABI,
    TRAIN_SDK_VERSION,
    TORCH_VERSION,
};

__attribute__((visibility("default"))) train_plugin_v1_t train_plugin_v1 = {
    TRAIN_PLUGIN_ABI_VERSION,
    sizeof(train_plugin_v1_t),
    train_plugin_info_v1.sdk_version,
    train_plugin_info_v1.torch_version,
    _GLIBCXX_USE_CXX11_ABI,
    0,
    nullptr,
};
}

namespace train::detail {
namespace {

std::vector<train_entry_v1_t>& entries() {
  static std::vector<train_entry_v1_t> table;
  return table;
}

void copy_message(const std::string& message, char* error, size_t error_size) {
  if (error == nullptr || error_size == 0) return;
  size_t n = std::min(message.size(), error_size - 1);
  // A cut never splits a UTF-8 character: back to the start of the one it would.
  while (n > 0 && n < message.size() && (static_cast<unsigned char>(message[n]) & 0xC0) == 0x80) {
    --n;
  }
  std::memcpy(error, message.data(), n);
  error[n] = '\0';
}

}  // namespace

int register_entry(const char* name, train_entry_fn_v1_t fn) {
  auto& table = entries();
  table.push_back({name, fn});
  ::train_plugin_v1.entries = table.data();
  ::train_plugin_v1.num_entries = static_cast<uint32_t>(table.size());
  return static_cast<int>(table.size());
}

int run_entry(const train_host_v1_t* host, char* error, size_t error_size, Body body) {
  if (host == nullptr || host->abi_version != TRAIN_PLUGIN_ABI_VERSION ||
      host->struct_size < TRAIN_HOST_V1_MIN_SIZE) {
    // Appended, not `"..." + to_string(...) + ")"`, on which GCC 12 warns
    // falsely (-Warray-bounds in std::string's move constructor).
    std::string message =
        "the worker's host table is incompatible with this plugin's SDK (plugin ABI ";
    message += std::to_string(TRAIN_PLUGIN_ABI_VERSION);
    message += ")";
    copy_message(message, error, error_size);
    return TRAIN_ERROR_HOST;
  }
  try {
    HostScope scope(host);
    body(Config::from_msgpack(host->config, host->config_size));
    return TRAIN_OK;
  } catch (const c10::Error& e) {
    copy_message(e.what_without_backtrace(), error, error_size);  // LibTorch's own, one message
  } catch (const std::exception& e) {
    copy_message(e.what(), error, error_size);
  } catch (...) {
    copy_message("train_func threw an exception that is not a std::exception", error, error_size);
  }
  return TRAIN_ERROR_EXCEPTION;
}

}  // namespace train::detail
