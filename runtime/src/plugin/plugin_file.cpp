#include "plugin/plugin_file.h"

#include <train/abi.h>
#include <train/version.h>
#include <trainrun/error.h>

#include <elf.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>

#include "common/torch_line.h"

namespace trainrun {
namespace {

std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& item : items) out += (out.empty() ? "" : ", ") + item;
  return out;
}

// A bounded string from a fixed-size field that may lack its NUL.
std::string field(const char* data, size_t size) { return std::string(data, strnlen(data, size)); }

// Reads the named sections of a 64-bit ELF file through its section headers.
class ElfFile {
 public:
  explicit ElfFile(const std::filesystem::path& path) : path_(path), in_(path, std::ios::binary) {
    std::error_code ec;
    if (!std::filesystem::exists(path, ec)) throw PluginError("plugin not found: " + path.string());
    if (!std::filesystem::is_regular_file(path, ec)) {
      throw PluginError("plugin " + path.string() + " is not a regular file");
    }
    size_ = std::filesystem::file_size(path, ec);
    Elf64_Ehdr header{};
    if (!read(0, &header, sizeof(header)) || std::memcmp(header.e_ident, ELFMAG, SELFMAG) != 0) {
      throw PluginError("plugin " + path.string() + " is not a shared library (no ELF header)");
    }
    if (header.e_ident[EI_CLASS] != ELFCLASS64 || header.e_type != ET_DYN ||
        header.e_shentsize != sizeof(Elf64_Shdr)) {
      throw PluginError("plugin " + path.string() + " is not a 64-bit shared library");
    }
    sections_.resize(header.e_shnum);
    if (header.e_shnum == 0 || header.e_shstrndx >= header.e_shnum ||
        !read(header.e_shoff, sections_.data(), sections_.size() * sizeof(Elf64_Shdr))) {
      throw PluginError("plugin " + path.string() + " has no readable section table");
    }
    names_ = contents(sections_[header.e_shstrndx]);
  }

  /// The contents of the section called `name`, or nothing.
  std::optional<std::string> section(const char* name) {
    for (const auto& s : sections_) {
      if (s.sh_name < names_.size() && std::strcmp(names_.c_str() + s.sh_name, name) == 0) {
        return contents(s);
      }
    }
    return std::nullopt;
  }

 private:
  bool read(uint64_t offset, void* out, uint64_t size) {
    if (offset > size_ || size > size_ - offset) return false;
    in_.seekg(static_cast<std::streamoff>(offset));
    in_.read(static_cast<char*>(out), static_cast<std::streamsize>(size));
    return static_cast<uint64_t>(in_.gcount()) == size;
  }

  std::string contents(const Elf64_Shdr& s) {
    if (s.sh_type == SHT_NOBITS || s.sh_size > (64u << 20)) return {};
    std::string data(s.sh_size, '\0');
    if (!read(s.sh_offset, data.data(), s.sh_size)) {
      throw PluginError("plugin " + path_.string() + " is truncated");
    }
    return data;
  }

  std::filesystem::path path_;
  std::ifstream in_;
  uint64_t size_ = 0;
  std::vector<Elf64_Shdr> sections_;
  std::string names_;
};

int major_of(const std::string& version) { return std::atoi(version.c_str()); }

}  // namespace

PluginInfo inspect_plugin_file(const std::filesystem::path& path) {
  ElfFile elf(path);
  auto info_bytes = elf.section(TRAIN_PLUGIN_INFO_SECTION);
  train_plugin_info_v1_t record{};
  if (!info_bytes || info_bytes->size() < offsetof(train_plugin_info_v1_t, sdk_version) ||
      std::memcmp(info_bytes->data(), TRAIN_PLUGIN_INFO_MAGIC, sizeof(record.magic)) != 0) {
    throw PluginError("plugin " + path.string() +
                      " has no trainrun descriptor: build it with TRAIN_FUNC and link "
                      "trainrun::sdk");
  }
  std::memcpy(&record, info_bytes->data(), std::min(info_bytes->size(), sizeof(record)));
  PluginInfo info;
  info.path = path;
  info.abi_version = record.abi_version;
  // Later fields are only read from a record of this ABI's layout.
  if (record.abi_version == TRAIN_PLUGIN_ABI_VERSION && info_bytes->size() >= sizeof(record)) {
    info.cxx11_abi = record.cxx11_abi;
    info.sdk_version = field(record.sdk_version, sizeof(record.sdk_version));
    info.torch_version = field(record.torch_version, sizeof(record.torch_version));
    std::string names = elf.section(TRAIN_PLUGIN_ENTRIES_SECTION).value_or("");
    for (size_t start = 0; start < names.size();) {
      size_t end = names.find('\0', start);
      if (end == std::string::npos) end = names.size();
      if (end > start) info.entries.push_back(names.substr(start, end - start));
      start = end + 1;
    }
    std::sort(info.entries.begin(), info.entries.end());  // the section's order is the compiler's
  }
  check_compatible(info);
  return info;
}

void check_compatible(const PluginInfo& info) {
  auto where = "plugin " + info.path.string();
  if (info.abi_version != TRAIN_PLUGIN_ABI_VERSION) {
    throw PluginError(where + " uses plugin ABI v" + std::to_string(info.abi_version) +
                      ", this trainrun uses v" + std::to_string(TRAIN_PLUGIN_ABI_VERSION) +
                      ": rebuild the plugin against this SDK");
  }
  if (major_of(info.sdk_version) != TRAIN_SDK_VERSION_MAJOR) {
    throw PluginError(where + " was built with trainrun SDK " + info.sdk_version +
                      ", this trainrun is " + TRAIN_SDK_VERSION +
                      ": rebuild the plugin against this SDK");
  }
  if (info.torch_version != TRAINRUN_TORCH_VERSION) {
    throw PluginError(where + " was built with LibTorch " + info.torch_version +
                      ", this trainrun uses " + TRAINRUN_TORCH_VERSION +
                      ": rebuild the plugin against the same LibTorch");
  }
  if (info.cxx11_abi != _GLIBCXX_USE_CXX11_ABI) {
    throw PluginError(where +
                      " was built with _GLIBCXX_USE_CXX11_ABI=" + std::to_string(info.cxx11_abi) +
                      ", this trainrun with " + std::to_string(_GLIBCXX_USE_CXX11_ABI));
  }
  if (info.entries.empty()) {
    throw PluginError(where + " exports no train function: add TRAIN_FUNC(your_function)");
  }
}

std::string resolve_entry(const PluginInfo& info, const std::string& requested) {
  const auto& entries = info.entries;
  if (requested.empty()) {
    if (entries.size() == 1) return entries.front();
    throw PluginError("plugin " + info.path.string() + " has several entries (" + join(entries) +
                      "): choose one with --entry");
  }
  if (std::find(entries.begin(), entries.end(), requested) == entries.end()) {
    throw PluginError("plugin " + info.path.string() + " has no entry '" + requested +
                      "' (available: " + join(entries) + ")");
  }
  return requested;
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
