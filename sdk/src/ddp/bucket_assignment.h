#pragma once

// Which parameters share a gradient bucket, after c10d's
// compute_bucket_assignment_by_size. Pure: the Reducer gives sizes and keys and
// builds its buckets from the answer, so the rule has its own unit test.

#include <cstddef>
#include <string>
#include <vector>

namespace train::detail {

/// One parameter as bucketing sees it.
struct BucketInput {
  size_t bytes = 0;  // numel * element size
  std::string key;   // dtype and device: only parameters with equal keys share a bucket
};

/// Assigns `params` (in the order their gradients are expected, reverse
/// registration order) to buckets: one open bucket per key, which closes once
/// its bytes reach its cap. Bucket 0 closes at `first_cap_bytes`, every later
/// bucket at `cap_bytes` (caps may be fractional: they come from MiB). Returns
/// each bucket's parameter indices, buckets in the order they were opened.
std::vector<std::vector<size_t>> assign_buckets(const std::vector<BucketInput>& params,
                                                double first_cap_bytes, double cap_bytes);

}  // namespace train::detail
