#include "plugin/plugin_library.h"

#include <trainrun/error.h>
#include <train/version.h>
#include <torch/csrc/api/include/torch/version.h>

#include <boost/dll/shared_library.hpp>
#include <dlfcn.h>

#include <algorithm>
#include <fstream>
#include <sstream>

namespace trainrun {
namespace {

std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& item : items) out += (out.empty() ? "" : ", ") + item;
  return out;
}

int major_of(const std::string& version) { return std::atoi(version.c_str()); }

void check_is_elf(const std::filesystem::path& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) {
    throw PluginError("plugin not found: " + path.string());
  }
  if (!std::filesystem::is_regular_file(path, ec)) {
    throw PluginError("plugin " + path.string() + " is not a regular file");
  }
  char magic[4] = {0};
  std::ifstream in(path, std::ios::binary);
  in.read(magic, sizeof(magic));
  if (in.gcount() != 4 || magic[0] != 0x7f || magic[1] != 'E' || magic[2] != 'L' ||
      magic[3] != 'F') {
    throw PluginError("plugin " + path.string() + " is not a shared library (no ELF header)");
  }
}

}  // namespace

PluginLibrary PluginLibrary::open(const std::filesystem::path& path) {
  check_is_elf(path);
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
  PluginLibrary plugin;
  plugin.descriptor_ = &library.get<const train_plugin_v1_t>(TRAIN_PLUGIN_SYMBOL);
  const auto& d = *plugin.descriptor_;
  // Library handles are reference counted and the library is RTLD_NODELETE, so
  // `library` going out of scope keeps the code mapped.
  auto where = "plugin " + path.string();
  if (d.abi_version != TRAIN_PLUGIN_ABI_VERSION) {
    throw PluginError(where + " uses plugin ABI v" + std::to_string(d.abi_version) +
                      ", this trainrun uses v" + std::to_string(TRAIN_PLUGIN_ABI_VERSION) +
                      ": rebuild the plugin against this SDK");
  }
  if (d.struct_size < sizeof(train_plugin_v1_t)) {
    throw PluginError(where + " has a truncated descriptor (" + std::to_string(d.struct_size) +
                      " bytes, expected at least " + std::to_string(sizeof(train_plugin_v1_t)) +
                      ")");
  }
  std::string sdk = d.sdk_version != nullptr ? d.sdk_version : "";
  std::string torch = d.torch_version != nullptr ? d.torch_version : "";
  if (major_of(sdk) != TRAIN_SDK_VERSION_MAJOR) {
    throw PluginError(where + " was built with trainrun SDK " + sdk + ", this trainrun is " +
                      TRAIN_SDK_VERSION + ": rebuild the plugin against this SDK");
  }
  if (torch != TORCH_VERSION) {
    throw PluginError(where + " was built with LibTorch " + torch + ", this trainrun uses " +
                      TORCH_VERSION + ": rebuild the plugin against the same LibTorch");
  }
  if (d.cxx11_abi != _GLIBCXX_USE_CXX11_ABI) {
    throw PluginError(where + " was built with _GLIBCXX_USE_CXX11_ABI=" +
                      std::to_string(d.cxx11_abi) + ", this trainrun with " +
                      std::to_string(_GLIBCXX_USE_CXX11_ABI));
  }
  if (d.num_entries == 0 || d.entries == nullptr) {
    throw PluginError(where + " exports no train function: add TRAIN_FUNC(your_function)");
  }
  plugin.info_.path = path;
  plugin.info_.abi_version = d.abi_version;
  plugin.info_.sdk_version = sdk;
  plugin.info_.torch_version = torch;
  plugin.info_.cxx11_abi = d.cxx11_abi;
  for (uint32_t i = 0; i < d.num_entries; ++i) plugin.info_.entries.emplace_back(d.entries[i].name);
  return plugin;
}

std::string PluginLibrary::resolve_entry(const std::string& requested) const {
  const auto& entries = info_.entries;
  if (requested.empty()) {
    if (entries.size() == 1) return entries.front();
    throw PluginError("plugin " + info_.path.string() + " has several entries (" + join(entries) +
                      "): choose one with --entry");
  }
  if (std::find(entries.begin(), entries.end(), requested) == entries.end()) {
    throw PluginError("plugin " + info_.path.string() + " has no entry '" + requested +
                      "' (available: " + join(entries) + ")");
  }
  return requested;
}

train_entry_fn_v1_t PluginLibrary::entry(const std::string& name) const {
  for (uint32_t i = 0; i < descriptor_->num_entries; ++i) {
    if (name == descriptor_->entries[i].name) return descriptor_->entries[i].fn;
  }
  return entry(resolve_entry(name));  // throws with the list of entries
}

std::string describe(const PluginInfo& info, const std::string& sha256) {
  std::ostringstream out;
  out << "plugin:      " << info.path.string() << "\n"
      << "sha256:      " << sha256 << "\n"
      << "plugin ABI:  v" << info.abi_version << "\n"
      << "SDK:         " << info.sdk_version << "\n"
      << "LibTorch:    " << info.torch_version << " (_GLIBCXX_USE_CXX11_ABI=" << info.cxx11_abi
      << ")\n"
      << "entries:     " << join(info.entries) << "\n";
  return out.str();
}

}  // namespace trainrun
