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
  recent_.push_front(key);
  entries_.emplace(key, Entry{promise.get_future().share(), 0, recent_.begin()});
  lock.unlock();
  Bytes bytes;
  try {
    bytes = std::make_shared<const std::string>(fetch());
  } catch (...) {
    promise.set_exception(std::current_exception());
    lock.lock();
    if (auto it = entries_.find(key); it != entries_.end() && it->second.bytes == 0) {
      recent_.erase(it->second.recent);
      entries_.erase(it);
    }
    throw;
  }
  promise.set_value(bytes);
  lock.lock();
  if (auto it = entries_.find(key); it != entries_.end() && it->second.bytes == 0) {
    it->second.bytes = bytes->size();
    used_ += bytes->size();
    evict();
  }
  return bytes;
}

void ChunkCache::evict() {
  // From the least recent; one being fetched (0 bytes) frees nothing, and
  // its waiters hold its future.
  while (used_ > capacity_ && !recent_.empty()) {
    const uint64_t key = recent_.back();
    auto it = entries_.find(key);
    used_ -= it->second.bytes;
    recent_.pop_back();
    entries_.erase(it);
  }
}

uint64_t ChunkCache::bytes() const {
  std::lock_guard lock(mutex_);
  return used_;
}

bool RecentChunks::add(uint64_t key) {
  std::lock_guard lock(mutex_);
  if (held_.count(key) > 0) return false;
  if (ring_[next_] != UINT64_MAX) held_.erase(ring_[next_]);
  ring_[next_] = key;
  held_.insert(key);
  next_ = (next_ + 1) % ring_.size();
  return true;
}

}  // namespace train::shards
