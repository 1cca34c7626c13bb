#include "data/sources/object.h"

#include "core/host.h"

#include <vector>

namespace train::sources {
namespace {

constexpr size_t kErrorBytes = 1024;

}  // namespace

std::unique_ptr<ShardSource> Object::open(const std::string& url) {
  const auto* host = detail::current_host_or_null();
  if (host == nullptr) {
    throw ShardError("shard " + url +
                     ": object storage is read inside a train function that trainrun started");
  }
  if (!TRAIN_HOST_HAS(host, read_object) || host->read_object == nullptr ||
      host->object_size == nullptr) {
    throw ShardError("shard " + url +
                     ": this worker's trainrun reads no object storage for data (update it)");
  }
  uint64_t size = 0;
  std::vector<char> error(kErrorBytes, '\0');
  const int rc = host->object_size(host->handle, url.c_str(), &size, error.data(), error.size());
  if (rc == 2) return nullptr;
  if (rc != 0) throw ShardError("shard " + url + ": " + error.data());
  return std::unique_ptr<ShardSource>(new Object(host, url, size));
}

void Object::read(uint64_t offset, uint64_t length, char* out) const {
  std::vector<char> error(kErrorBytes, '\0');
  const int rc = host_->read_object(host_->handle, url_.c_str(), offset, length, out,
                                    error.data(), error.size());
  if (rc == 2) {
    throw ShardError("the object is gone, or ends before byte " +
                     std::to_string(offset + length) + " (" + error.data() + ")");
  }
  if (rc != 0) throw ShardError(error.data());
}

}  // namespace train::sources
