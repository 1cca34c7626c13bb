#pragma once

// The worker's plugin cache: <cache_dir>/<sha256>.so. A plugin is downloaded
// into a temporary file, hashed as it arrives, and renamed into place only when
// its size and sha256 match what the controller announced, so a cached file is
// always complete. The workers of a host that share a cache download each
// plugin once: the one holding the download claim (an exclusive lock on
// <sha256>.lock) fetches it; the others wait until they can take the lock
// shared, which means no download is under way, and look again. A claim ends
// with its process, however that ends, and the next claimant clears the
// partial files this host's killed claimants left. Where the filesystem has no
// locks (NFS without a lock manager), every worker downloads for itself.

#include <filesystem>
#include <optional>
#include <string>
#include <utility>

#include "common/fd.h"
#include "transfer/chunked_file.h"

namespace trainrun {

/// The cached plugin with this hash, if present and intact.
std::optional<std::filesystem::path> find_cached_plugin(const std::filesystem::path& cache_dir,
                                                        const std::string& sha256);

/// The right to download one plugin into a cache, held by one process of the
/// host at a time (exclusive), or the knowledge that no download is under way
/// (shared).
class DownloadClaim {
 public:
  enum class Kind { kShared, kExclusive };
  /// The claim, or none while another process holds it exclusively (or, for an
  /// exclusive claim, at all). An exclusive claim removes this host's partial
  /// downloads of the plugin, left behind by earlier claimants. Where the
  /// filesystem cannot lock, a claim that locks nothing. Throws IoError.
  static std::optional<DownloadClaim> try_take(const std::filesystem::path& cache_dir,
                                               const std::string& sha256, Kind kind);
  DownloadClaim(DownloadClaim&&) noexcept = default;
  DownloadClaim& operator=(DownloadClaim&&) = delete;
  DownloadClaim(const DownloadClaim&) = delete;

 private:
  explicit DownloadClaim(Fd fd) : fd_(std::move(fd)) {}
  Fd fd_;  // the lock file: closing it releases the claim
};

class PluginDownload {
 public:
  PluginDownload(const std::filesystem::path& cache_dir, std::string sha256, uint64_t size);
  ~PluginDownload();
  PluginDownload(const PluginDownload&) = delete;
  PluginDownload& operator=(const PluginDownload&) = delete;

  /// Writes a chunk; chunks must arrive in order. Throws ProtocolError on a gap
  /// or overflow, IoError on a write error.
  void write(uint64_t offset, const void* data, size_t size) { file_.write(offset, data, size); }
  bool complete() const { return file_.complete(); }
  /// Verifies the hash and moves the file into the cache. Throws ProtocolError
  /// on a mismatch.
  std::filesystem::path commit();

 private:
  std::filesystem::path final_path_;
  std::filesystem::path temp_path_;
  std::string sha256_;
  ChunkedFile file_;  // temp_path_, hashed as it is written
};

}  // namespace trainrun
