#pragma once

// A plugin loaded into a worker, with its descriptor checked again after
// loading (the file may have changed since the controller read it, and the
// dynamic loader is the final judge). Opened with RTLD_NOW | RTLD_LOCAL |
// RTLD_NODELETE: resolved up front, private symbols, never unloaded, since
// LibTorch may hold pointers into a plugin (registered ops, autograd
// functions) after the last handle is closed. Not thread-safe.

#include <train/abi.h>

#include <filesystem>
#include <string>

#include "plugin/plugin_file.h"

namespace trainrun {

class PluginLibrary {
 public:
  /// Loads and checks a plugin. Throws PluginError naming the file.
  static PluginLibrary open(const std::filesystem::path& path);

  /// The entry's C function. Throws PluginError listing the entries when unknown.
  train_entry_fn_v1_t entry(const std::string& name) const;

 private:
  PluginInfo info_;
  const train_plugin_v1_t* descriptor_ = nullptr;
};

}  // namespace trainrun
