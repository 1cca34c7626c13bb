#pragma once

// Chunks of remote shards kept in a local directory across epochs, bounded in
// bytes: each chunk a file named by its shard, the shard's size and the
// chunk's range, written under a temporary name and renamed whole, so that
// several ranks of a host can share the directory and a crash leaves no
// partial chunk under a chunk's name. Past the bound, the files used least
// recently (by modification time, which a hit renews) go first. Thread-safe;
// a directory that cannot be written is a cache that holds nothing.

#include <cstdint>
#include <filesystem>
#include <mutex>
#include <optional>
#include <string>

namespace train::shards {

class DiskCache {
 public:
  /// Creates `dir` when missing; throws ShardError when it cannot.
  DiskCache(std::filesystem::path dir, uint64_t capacity);

  /// The chunk's bytes when the directory holds them whole (`bytes` long).
  std::optional<std::string> load(const std::string& name, uint64_t bytes);
  /// Keeps the chunk's bytes, evicting the oldest files past the bound.
  void store(const std::string& name, const std::string& bytes);

  /// The file name of a chunk: the shard's URL hashed, its size, the range.
  static std::string name(const std::string& url, uint64_t shard_bytes, uint64_t offset,
                          uint64_t length);

 private:
  void evict();  // with mutex_ held

  std::filesystem::path dir_;
  uint64_t capacity_;
  std::mutex mutex_;
  uint64_t stored_ = 0;  // bytes this process wrote since the last scan
};

}  // namespace train::shards
