#include "worker/plugin_library.h"

#include <trainrun/error.h>

#include <boost/dll/shared_library.hpp>
#include <dlfcn.h>

#include <algorithm>

namespace trainrun {

PluginLibrary PluginLibrary::open(const std::filesystem::path& path) {
  auto mode = boost::dll::load_mode::rtld_now | boost::dll::load_mode::rtld_local |
              static_cast<boost::dll::load_mode::type>(RTLD_NODELETE);
  boost::dll::shared_library library;
  boost::dll::fs::error_code ec;
  library.load(std::filesystem::absolute(path), mode, ec);
  if (ec) {
    const char* detail = ::dlerror();
    throw PluginError("cannot load plugin " + path.string() + ": " +
                      (detail != nullptr ? detail : ec.message()));
  }
  if (!library.has(TRAIN_PLUGIN_SYMBOL)) {
    throw PluginError("plugin " + path.string() + " has no trainrun descriptor (symbol " +
                      TRAIN_PLUGIN_SYMBOL + "): build it with TRAIN_FUNC and link trainrun::sdk");
  }
  // The library is RTLD_NODELETE: `library` going out of scope keeps it mapped.
  PluginLibrary plugin;
  plugin.descriptor_ = &library.get<const train_plugin_v1_t>(TRAIN_PLUGIN_SYMBOL);
  const auto& d = *plugin.descriptor_;
  auto& info = plugin.info_;
  info.path = path;
  info.abi_version = d.abi_version;
  if (d.abi_version == TRAIN_PLUGIN_ABI_VERSION && d.struct_size >= sizeof(train_plugin_v1_t)) {
    info.sdk_version = d.sdk_version != nullptr ? d.sdk_version : "";
    info.torch_version = d.torch_version != nullptr ? d.torch_version : "";
    info.cxx11_abi = d.cxx11_abi;
    for (uint32_t i = 0; i < d.num_entries && d.entries != nullptr; ++i) {
      info.entries.emplace_back(d.entries[i].name);
    }
    std::sort(info.entries.begin(), info.entries.end());
  }
  check_compatible(info);
  return plugin;
}

train_entry_fn_v1_t PluginLibrary::entry(const std::string& name) const {
  for (uint32_t i = 0; i < descriptor_->num_entries; ++i) {
    if (name == descriptor_->entries[i].name) return descriptor_->entries[i].fn;
  }
  resolve_entry(info_, name);  // throws, listing the entries
  throw PluginError("plugin " + info_.path.string() + " has no entry '" + name + "'");
}

}  // namespace trainrun
