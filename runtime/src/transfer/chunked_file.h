#pragma once

// A file written from chunks that arrive in order: a plugin or checkpoint
// being downloaded, a checkpoint being streamed or copied into storage. One
// owner; not thread-safe.

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>

#include "common/fd.h"
#include "common/hash.h"

namespace trainrun {

/// A file written from chunks that arrive in order, durable when finished.
/// Write-back starts as it goes, so finishing does not wait for all of it.
class ChunkedFile {
 public:
  enum class Hashing { kNone, kSha256 };
  /// kPageCache writes through the page cache. kDirect writes around it
  /// (O_DIRECT, through an aligned buffer): for files nobody reads soon, such
  /// as a streamed checkpoint, it spares the kernel allocating and filling a
  /// page-cache page for every 4 KiB, which is most of a buffered write's cost.
  /// Where the filesystem has no direct I/O, it writes through the page cache.
  enum class Caching { kPageCache, kDirect };

  /// Creates (or truncates) `path`, which will hold `size` bytes. With
  /// Hashing::kSha256, finish() returns the sha256 of what was written.
  /// Throws IoError.
  ChunkedFile(std::filesystem::path path, uint64_t size, Hashing hashing,
              Caching caching = Caching::kPageCache);
  ChunkedFile(const ChunkedFile&) = delete;
  ChunkedFile& operator=(const ChunkedFile&) = delete;

  /// Appends a chunk, which must start where the last one ended and stay within
  /// the size. Throws ProtocolError otherwise, IoError on a write error.
  void write(uint64_t offset, const void* data, size_t size);
  /// write(), for a chunk that is also bytes [offset, offset + size) of the
  /// file `source`: copied by the kernel (copy_file_range) when it can, which
  /// spares a copy through user memory; `data` is still hashed.
  void write_from(int source, uint64_t offset, const void* data, size_t size);
  bool complete() const { return written_ == size_; }
  /// fsyncs and closes the file; its sha256 (empty without `hash`). Throws
  /// ProtocolError if bytes are missing, IoError if the data did not reach the disk.
  std::string finish();

 private:
  std::filesystem::path path_;
  uint64_t size_;
  uint64_t written_ = 0;
  uint64_t flushed_ = 0;   // write-back started up to here
  bool in_kernel_ = true;  // copy_file_range works between these files
  bool direct_ = false;    // fd_ is open with O_DIRECT
  Fd fd_;                  // none once finished
  std::optional<Sha256> hash_;
  std::unique_ptr<char, void (*)(void*)> aligned_{nullptr, &std::free};  // for direct writes
  size_t aligned_size_ = 0;

  void check_next(uint64_t offset, size_t size) const;
  void write_direct(const char* data, size_t size);
  void write_whole(const char* data, size_t size);  // write_all, or IoError naming the file
  void wrote(size_t size);
};

}  // namespace trainrun
