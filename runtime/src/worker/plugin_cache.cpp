#include "worker/plugin_cache.h"

#include <trainrun/error.h>

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

namespace trainrun {

std::optional<std::filesystem::path> find_cached_plugin(const std::filesystem::path& cache_dir,
                                                        const std::string& sha256) {
  auto path = cache_dir / (sha256 + ".so");
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return std::nullopt;
  try {
    if (sha256_file(path) == sha256) return path;
  } catch (const IoError&) {
  }
  std::filesystem::remove(path, ec);  // damaged: fetch it again
  return std::nullopt;
}

PluginDownload::PluginDownload(const std::filesystem::path& cache_dir, std::string sha256,
                               uint64_t size)
    : final_path_(cache_dir / (sha256 + ".so")), sha256_(std::move(sha256)), size_(size) {
  std::error_code ec;
  std::filesystem::create_directories(cache_dir, ec);
  if (ec) throw IoError("cannot create plugin cache " + cache_dir.string() + ": " + ec.message());
  temp_path_ = final_path_;
  temp_path_ += ".part." + std::to_string(::getpid());
  file_ = std::fopen(temp_path_.c_str(), "wb");
  if (file_ == nullptr) {
    throw IoError("cannot create " + temp_path_.string() + ": " + std::strerror(errno));
  }
}

PluginDownload::~PluginDownload() {
  if (file_ != nullptr) std::fclose(file_);
  std::error_code ec;
  std::filesystem::remove(temp_path_, ec);
}

void PluginDownload::write(uint64_t offset, const void* data, size_t size) {
  if (offset != received_ || received_ + size > size_) {
    throw ProtocolError("plugin chunk at offset " + std::to_string(offset) + " (" +
                        std::to_string(size) + " bytes) does not follow byte " +
                        std::to_string(received_) + " of " + std::to_string(size_));
  }
  if (std::fwrite(data, 1, size, file_) != size) {
    throw IoError("cannot write " + temp_path_.string() + ": " + std::strerror(errno));
  }
  hash_.update(data, size);
  received_ += size;
}

std::filesystem::path PluginDownload::commit() {
  if (std::fclose(std::exchange(file_, nullptr)) != 0) {
    throw IoError("cannot write " + temp_path_.string() + ": " + std::strerror(errno));
  }
  auto digest = hash_.hex_digest();
  if (digest != sha256_) {
    throw ProtocolError("downloaded plugin has sha256 " + digest + ", expected " + sha256_);
  }
  std::error_code ec;
  std::filesystem::rename(temp_path_, final_path_, ec);
  if (ec) throw IoError("cannot move plugin into " + final_path_.string() + ": " + ec.message());
  return final_path_;
}

}  // namespace trainrun
