#include "worker/object_reads.h"

#include <algorithm>

#include "storage/s3_config.h"

namespace trainrun {
namespace {

constexpr size_t kMaxIdleClients = 32;  // connections kept open between reads

// A read's bucket and key; the key must name an object.
s3::Location object_of(const std::string& url) {
  auto location = s3::parse_url(url);
  if (location.prefix.empty()) {
    throw UsageError("'" + url + "' names a bucket, not an object (s3://BUCKET/KEY)");
  }
  return location;
}

}  // namespace

class ObjectReads::Lease {
 public:
  Lease(ObjectReads* owner, std::unique_ptr<s3::Client> client)
      : owner_(owner), client_(std::move(client)) {}
  Lease(Lease&&) = default;
  ~Lease() {
    if (!client_) return;
    std::lock_guard lock(owner_->mutex_);
    if (owner_->idle_.size() < kMaxIdleClients) owner_->idle_.push_back(std::move(client_));
  }
  s3::Client* operator->() { return client_.get(); }

 private:
  ObjectReads* owner_;
  std::unique_ptr<s3::Client> client_;
};

ObjectReads::Lease ObjectReads::borrow(const std::string& bucket) {
  std::unique_lock lock(mutex_);
  for (auto it = idle_.begin(); it != idle_.end(); ++it) {
    if ((*it)->bucket() == bucket) {
      auto client = std::move(*it);
      idle_.erase(it);
      return Lease(this, std::move(client));
    }
  }
  if (!config_) config_ = s3::resolve_config();
  auto config = *config_;
  lock.unlock();
  return Lease(this, std::make_unique<s3::Client>(std::move(config), bucket));
}

std::optional<uint64_t> ObjectReads::size(const std::string& url) {
  const auto location = object_of(url);
  return borrow(location.bucket)->head(location.prefix);
}

void ObjectReads::read(const std::string& url, uint64_t offset, uint64_t length, void* out) {
  const auto location = object_of(url);
  borrow(location.bucket)->get_range(location.prefix, offset, static_cast<size_t>(length), out);
}

}  // namespace trainrun
