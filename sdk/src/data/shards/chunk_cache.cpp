#include "data/shards/chunk_cache.h"

namespace train::shards {

ChunkCache::Bytes ChunkCache::get(uint64_t key, const std::function<std::string()>& fetch) {
  std::unique_lock lock(mutex_);
  if (auto it = entries_.find(key); it != entries_.end()) {
    recent_.splice(recent_.begin(), recent_, it->second.recent);
    auto data = it->second.data;
    lock.unlock();
    return data.get();
  }
  std::promise<Bytes> promise;
  const uint64_t generation = ++generations_;
  recent_.push_front(key);
  entries_.emplace(key, Entry{promise.get_future().share(), 0, generation, recent_.begin()});
  lock.unlock();
  // This fetch's entry, unless it was evicted (and perhaps fetched again) meanwhile.
  auto mine = [&] {
    auto it = entries_.find(key);
    return it != entries_.end() && it->second.generation == generation ? it : entries_.end();
  };
  Bytes bytes;
  try {
    bytes = std::make_shared<const std::string>(fetch());
  } catch (...) {
    promise.set_exception(std::current_exception());
    lock.lock();
    if (auto it = mine(); it != entries_.end()) {  // forgotten: the next get tries again
      recent_.erase(it->second.recent);
      entries_.erase(it);
    }
    throw;
  }
  promise.set_value(bytes);
  lock.lock();
  if (auto it = mine(); it != entries_.end()) {
    it->second.bytes = bytes->size();
    used_ += bytes->size();
    evict();
  }
  return bytes;
}

void ChunkCache::evict() {
  // From the least recent; one being fetched (0 bytes) frees nothing, and
  // its waiters hold its future.
  for (auto key = recent_.rbegin(); used_ > capacity_ && key != recent_.rend();) {
    auto it = entries_.find(*key);
    if (it->second.bytes == 0) {  // being fetched: kept, so that it is fetched once
      ++key;
      continue;
    }
    used_ -= it->second.bytes;
    key = std::make_reverse_iterator(recent_.erase(std::next(key).base()));
    entries_.erase(it);
  }
}

uint64_t ChunkCache::bytes() const {
  std::lock_guard lock(mutex_);
  return used_;
}

}  // namespace train::shards
