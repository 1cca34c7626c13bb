#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "ddp/bucket_assignment.h"

using train::detail::assign_buckets;
using train::detail::BucketInput;
using Buckets = std::vector<std::vector<size_t>>;

namespace {

const std::string kFloatCpu = "Float/cpu";
const std::string kDoubleCpu = "Double/cpu";
const std::string kFloatCuda = "Float/cuda:0";

// `count` parameters of `bytes` each, all with `key`.
std::vector<BucketInput> same_key(size_t count, size_t bytes, const std::string& key = kFloatCpu) {
  return std::vector<BucketInput>(count, BucketInput{bytes, key});
}

}  // namespace

TEST_CASE("no parameters, no buckets") { CHECK(assign_buckets({}, 1024, 1024).empty()); }

TEST_CASE("a bucket closes once its bytes reach its cap") {
  CHECK(assign_buckets(same_key(6, 4), 8, 8) == Buckets{{0, 1}, {2, 3}, {4, 5}});
  // Under the cap the bucket stays open; the last one may stay under it.
  CHECK(assign_buckets(same_key(5, 4), 9, 9) == Buckets{{0, 1, 2}, {3, 4}});
  CHECK(assign_buckets(same_key(3, 4), 1000, 1000) == Buckets{{0, 1, 2}});
}

TEST_CASE("bucket 0 closes at the first cap, later buckets at the other cap") {
  CHECK(assign_buckets(same_key(7, 4), 4, 12) == Buckets{{0}, {1, 2, 3}, {4, 5, 6}});
  CHECK(assign_buckets(same_key(5, 4), 16, 4) == Buckets{{0, 1, 2, 3}, {4}});
}

TEST_CASE("only bucket 0 gets the first cap, not the first bucket of every key") {
  // The Double bucket is bucket 1, so it closes at the later cap (12), not at 4.
  std::vector<BucketInput> params{
      {4, kFloatCpu}, {4, kDoubleCpu}, {4, kDoubleCpu}, {4, kDoubleCpu}, {4, kFloatCpu}};
  CHECK(assign_buckets(params, 4, 12) == Buckets{{0}, {1, 2, 3}, {4}});
}

TEST_CASE("one open bucket per dtype and device") {
  std::vector<BucketInput> params{{4, kFloatCpu}, {4, kDoubleCpu}, {4, kFloatCuda},
                                  {4, kFloatCpu}, {4, kDoubleCpu}, {4, kFloatCuda}};
  CHECK(assign_buckets(params, 1000, 1000) == Buckets{{0, 3}, {1, 4}, {2, 5}});

  SUBCASE("buckets come in the order they were opened, a key reopening after a close") {
    std::vector<BucketInput> mixed{
        {8, kFloatCpu}, {4, kDoubleCpu}, {4, kFloatCpu}, {4, kDoubleCpu}, {4, kFloatCpu}};
    // Bucket 0 (Float) closes at once; the next Float parameter opens bucket 2.
    CHECK(assign_buckets(mixed, 8, 8) == Buckets{{0}, {1, 3}, {2, 4}});
  }
}

TEST_CASE("a parameter larger than the cap closes the bucket it joins") {
  std::vector<BucketInput> params{{4, kFloatCpu}, {100, kFloatCpu}, {4, kFloatCpu}};
  CHECK(assign_buckets(params, 10, 10) == Buckets{{0, 1}, {2}});
  // Opening a bucket, it fills it alone.
  std::vector<BucketInput> first{{100, kFloatCpu}, {4, kFloatCpu}, {100, kFloatCpu}};
  CHECK(assign_buckets(first, 10, 10) == Buckets{{0}, {1, 2}});
}

TEST_CASE("caps need not be whole bytes, and a zero cap gives a bucket per parameter") {
  // Caps come from MiB: 4.5 bytes takes two 4-byte parameters to reach.
  CHECK(assign_buckets(same_key(3, 4), 4.5, 8.5) == Buckets{{0, 1}, {2}});
  CHECK(assign_buckets(same_key(3, 4), 0, 0) == Buckets{{0}, {1}, {2}});
}
