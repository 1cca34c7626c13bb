#pragma once

// Chunks of remote shards held in memory: bounded in bytes, the least
// recently used out first. A chunk being fetched is waited for by the other
// threads that want it, never fetched twice at once; a fetch that fails is
// forgotten, so the next get tries again. Thread-safe.

#include <cstdint>
#include <functional>
#include <future>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>


namespace train::shards {

class ChunkCache {
 public:
  using Bytes = std::shared_ptr<const std::string>;

  explicit ChunkCache(uint64_t capacity) : capacity_(capacity) {}

  /// The chunk `key`, fetched with `fetch` unless held or being fetched.
  /// Rethrows what `fetch` throws, to every thread that waited for it.
  Bytes get(uint64_t key, const std::function<std::string()>& fetch);

  /// Bytes held now (what is being fetched not counted).
  uint64_t bytes() const;

 private:
  struct Entry {
    std::shared_future<Bytes> data;
    uint64_t bytes = 0;  // 0 while being fetched
    uint64_t generation = 0;  // which fetch made it (a key fetched again is another)
    std::list<uint64_t>::iterator recent;
  };
  void evict();  // with mutex_ held

  uint64_t capacity_;
  mutable std::mutex mutex_;
  std::unordered_map<uint64_t, Entry> entries_;
  std::list<uint64_t> recent_;  // most recent first
  uint64_t used_ = 0;
  uint64_t generations_ = 0;
};

}  // namespace train::shards
