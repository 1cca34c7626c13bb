#pragma once

// A shard in object storage (s3://BUCKET/KEY), read by ranges through the
// worker's host table (object_size, read_object), with the run's S3
// settings. Reads come from any loader thread; the host table outlives the
// train function's datasets.

#include <train/abi.h>
#include <train/shard_files.h>

#include <memory>
#include <string>

namespace train::sources {

class Object : public ShardSource {
 public:
  /// The object at `url`, or nullptr when there is none. Throws ShardError
  /// outside a train function, under a worker that reads no object storage,
  /// or when the store cannot be asked.
  static std::unique_ptr<ShardSource> open(const std::string& url);

  uint64_t size() const override { return size_; }
  /// Throws ShardError saying what failed; the caller names the shard.
  void read(uint64_t offset, uint64_t length, char* out) const override;
  using ShardSource::read;
  bool remote() const override { return true; }

 private:
  Object(const train_host_v1_t* host, std::string url, uint64_t size)
      : host_(host), url_(std::move(url)), size_(size) {}
  const train_host_v1_t* host_;
  std::string url_;
  uint64_t size_;
};

}  // namespace train::sources
