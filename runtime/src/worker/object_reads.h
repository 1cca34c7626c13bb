#pragma once

// The host table's object reads (object_size, read_object): a train
// function's data in object storage, read by ranges with the run's S3
// settings. Thread-safe: loader threads read at once, each call on a client
// borrowed from a pool (an s3::Client holds one connection and is not).

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "storage/s3_client.h"

namespace trainrun {

class ObjectReads {
 public:
  ObjectReads() = default;
  ObjectReads(const ObjectReads&) = delete;
  ObjectReads& operator=(const ObjectReads&) = delete;

  /// The object's size; nothing when there is none. Throws S3Error (after
  /// the client's retries) or UsageError for a URL that is not s3://BUCKET/KEY.
  std::optional<uint64_t> size(const std::string& url);
  /// `length` bytes at `offset` into `out`; throws S3Error when they do not
  /// all come (the object is gone or shorter).
  void read(const std::string& url, uint64_t offset, uint64_t length, void* out);

 private:
  // A client of one bucket, back to the pool when it goes out of scope.
  class Lease;
  Lease borrow(const std::string& bucket);

  std::mutex mutex_;
  std::optional<s3::Config> config_;  // resolved at the first call
  std::vector<std::unique_ptr<s3::Client>> idle_;
};

}  // namespace trainrun
