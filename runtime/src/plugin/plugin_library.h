#pragma once

// A loaded plugin and its checked descriptor. Libraries are opened with
// RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE: resolved up front, private symbols,
// and never unloaded, since LibTorch may hold pointers into a plugin (registered
// ops, autograd functions) after the last handle is closed. Not thread-safe;
// open and inspect on one thread.

#include <train/abi.h>

#include <filesystem>
#include <string>
#include <vector>

namespace trainrun {

/// What a plugin's descriptor says about it.
struct PluginInfo {
  std::filesystem::path path;
  uint32_t abi_version = 0;
  std::string sdk_version;
  std::string torch_version;
  int cxx11_abi = 0;
  std::vector<std::string> entries;
};

class PluginLibrary {
 public:
  /// Opens and checks a plugin. Throws PluginError with one line naming the file
  /// for each way it can be unusable: missing, not a shared library, not
  /// loadable, no descriptor, ABI / SDK / LibTorch / C++ ABI mismatch (naming
  /// both sides), no entries.
  static PluginLibrary open(const std::filesystem::path& path);

  const PluginInfo& info() const { return info_; }

  /// The entry to run: `requested`, or the only entry when `requested` is empty.
  /// Throws PluginError listing the entries when it is unknown or ambiguous.
  std::string resolve_entry(const std::string& requested) const;

  /// The entry's C function. Throws PluginError when it is unknown.
  train_entry_fn_v1_t entry(const std::string& name) const;

 private:
  PluginInfo info_;
  const train_plugin_v1_t* descriptor_ = nullptr;
};

/// Multi-line description for `trainrun inspect`.
std::string describe(const PluginInfo& info, const std::string& sha256);

}  // namespace trainrun
