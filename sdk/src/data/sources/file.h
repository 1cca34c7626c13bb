#pragma once

// A local file read by ranges (pread): any number of threads read at once.
// Owns its descriptor.

#include <train/shard_files.h>

#include <cstdint>
#include <string>
#include <string_view>

namespace train::sources {

class LocalFile : public ShardSource {
 public:
  /// Opens `path` for reading; throws train::ShardError naming it.
  explicit LocalFile(std::string path);
  ~LocalFile() override;
  LocalFile(const LocalFile&) = delete;
  LocalFile& operator=(const LocalFile&) = delete;

  const std::string& path() const { return path_; }
  uint64_t size() const override { return size_; }
  /// `length` bytes at `offset`; throws train::ShardError when the file
  /// ends before them (it shrank) or a read fails.
  void read(uint64_t offset, uint64_t length, char* out) const override;
  using ShardSource::read;
  /// posix_fadvise(WILLNEED): the kernel reads the range ahead, in the background.
  void will_need(uint64_t offset, uint64_t length) const override;
  /// The whole file mapped, for a scan; empty for an empty file.
  class Mapping {
   public:
    Mapping(const void* data, size_t size) : data_(data), size_(size) {}
    ~Mapping();
    Mapping(const Mapping&) = delete;
    Mapping& operator=(const Mapping&) = delete;
    std::string_view bytes() const {
      return {static_cast<const char*>(data_), size_};
    }

   private:
    const void* data_;
    size_t size_;
  };
  Mapping map() const;

 private:
  std::string path_;
  int fd_ = -1;
  uint64_t size_ = 0;
};

}  // namespace train::sources
