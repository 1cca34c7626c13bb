#include "transfer/plugin_cache.h"

#include <trainrun/error.h>

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "common/network.h"

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
  // Damaged: fetch it again. The download's rename replaces this copy; it is
  // not removed here, where it could be the good copy another worker on this
  // host has just renamed into place and is about to load.
  return std::nullopt;
}

namespace {

void create_cache(const std::filesystem::path& cache_dir) {
  std::error_code ec;
  std::filesystem::create_directories(cache_dir, ec);
  if (ec) throw IoError("cannot create plugin cache " + cache_dir.string() + ": " + ec.message());
}

}  // namespace

std::optional<DownloadClaim> DownloadClaim::try_take(const std::filesystem::path& cache_dir,
                                                     const std::string& sha256, Kind kind) {
  create_cache(cache_dir);
  auto lock_path = cache_dir / (sha256 + ".lock");
  Fd fd(::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
  if (!fd) throw IoError("cannot open " + lock_path.string() + ": " + std::strerror(errno));
  if (::flock(fd.get(), (kind == Kind::kShared ? LOCK_SH : LOCK_EX) | LOCK_NB) != 0) {
    int error = errno;
    fd.reset();
    if (error == EWOULDBLOCK) return std::nullopt;
    return DownloadClaim(Fd());  // no locks here (ENOLCK): each worker for itself
  }
  if (kind == Kind::kShared) return DownloadClaim(std::move(fd));
  // No other process of this host is downloading the plugin: its partial
  // files are leftovers. Another host's (a cache on NFS) are not touched.
  std::error_code ec;
  auto prefix = sha256 + ".so.part." + host_name() + ".";
  for (const auto& entry : std::filesystem::directory_iterator(cache_dir, ec)) {
    if (entry.path().filename().string().rfind(prefix, 0) == 0) {
      std::filesystem::remove(entry.path(), ec);
    }
  }
  return DownloadClaim(std::move(fd));
}

namespace {

std::filesystem::path partial_path(const std::filesystem::path& cache_dir,
                                   const std::string& sha256) {
  create_cache(cache_dir);
  return cache_dir / (sha256 + ".so.part." + host_name() + "." + std::to_string(::getpid()));
}

}  // namespace

PluginDownload::PluginDownload(const std::filesystem::path& cache_dir, std::string sha256,
                               uint64_t size)
    : final_path_(cache_dir / (sha256 + ".so")),
      temp_path_(partial_path(cache_dir, sha256)),
      sha256_(std::move(sha256)),
      file_(temp_path_, size, ChunkedFile::Hashing::kSha256) {}

PluginDownload::~PluginDownload() {
  std::error_code ec;
  std::filesystem::remove(temp_path_, ec);
}

std::filesystem::path PluginDownload::commit() {
  auto digest = file_.finish();
  if (digest != sha256_) {
    throw ProtocolError("downloaded plugin has sha256 " + digest + ", expected " + sha256_);
  }
  std::error_code ec;
  std::filesystem::rename(temp_path_, final_path_, ec);
  if (ec) throw IoError("cannot move plugin into " + final_path_.string() + ": " + ec.message());
  return final_path_;
}

}  // namespace trainrun
