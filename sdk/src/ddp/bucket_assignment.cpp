#include "ddp/bucket_assignment.h"

#include <map>

namespace train::detail {

std::vector<std::vector<size_t>> assign_buckets(const std::vector<BucketInput>& params,
                                                double first_cap_bytes, double cap_bytes) {
  std::vector<std::vector<size_t>> buckets;
  std::vector<size_t> bucket_bytes;
  std::map<std::string, size_t> open;  // key -> its open bucket
  for (size_t i = 0; i < params.size(); ++i) {
    auto found = open.find(params[i].key);
    if (found == open.end()) {
      found = open.emplace(params[i].key, buckets.size()).first;
      buckets.emplace_back();
      bucket_bytes.push_back(0);
    }
    size_t b = found->second;
    buckets[b].push_back(i);
    bucket_bytes[b] += params[i].bytes;
    if (static_cast<double>(bucket_bytes[b]) >= (b == 0 ? first_cap_bytes : cap_bytes)) {
      open.erase(found);
    }
  }
  return buckets;
}

}  // namespace train::detail
