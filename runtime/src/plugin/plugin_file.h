#pragma once

// Inspecting a plugin from its file, without loading it: the controller reads
// the SDK's `.trainrun_info` and `.trainrun_entries` ELF sections, so it never
// loads LibTorch and refuses a bad plugin before any worker starts. The worker
// repeats the checks on the loaded descriptor (plugin_library.h).

#include <filesystem>
#include <string>
#include <vector>

namespace trainrun {

/// What a plugin says about itself.
struct PluginInfo {
  std::filesystem::path path;
  uint32_t abi_version = 0;
  std::string sdk_version;
  std::string torch_version;
  int cxx11_abi = 0;
  std::vector<std::string> entries;  // sorted by name
};

/// Reads and checks a plugin file. Throws PluginError with one line naming the
/// file: missing, not a shared library, no trainrun descriptor, ABI / SDK /
/// LibTorch / C++ ABI mismatch (naming both sides), no entries.
PluginInfo inspect_plugin_file(const std::filesystem::path& path);

/// Throws PluginError if a plugin with `info` cannot run in this trainrun.
void check_compatible(const PluginInfo& info);

/// The entry to run: `requested`, or the only entry when `requested` is empty.
/// Throws PluginError listing the entries when it is unknown or ambiguous.
std::string resolve_entry(const PluginInfo& info, const std::string& requested);

/// Multi-line description for `trainrun inspect`.
std::string describe(const PluginInfo& info, const std::string& sha256);

}  // namespace trainrun
