#include "transfer/chunked_file.h"

#include <trainrun/error.h>

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string_view>

#include "common/atomic_file.h"

namespace trainrun {
namespace {

// Write-back is started every this many bytes (sync_file_range), so the fsync
// at the end finds little left to write instead of all of it at once.
constexpr uint64_t kWriteBehind = 4 << 20;
// What direct I/O needs aligned (memory, file offset and length): the page
// size, a multiple of every common device's logical block.
constexpr size_t kDirectAlignment = 4096;

std::string errno_text() { return std::strerror(errno); }

// Starts write-back of [from, to) of fd; a hint, so its failure is ignored.
void write_behind(int fd, uint64_t from, uint64_t to) {
  ::sync_file_range(fd, static_cast<off64_t>(from), static_cast<off64_t>(to - from),
                    SYNC_FILE_RANGE_WRITE);
}

}  // namespace

ChunkedFile::ChunkedFile(std::filesystem::path path, uint64_t size, Hashing hashing,
                         Caching caching)
    : path_(std::move(path)), size_(size) {
  constexpr int kFlags = O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC;
  if (caching == Caching::kDirect) {
    fd_.reset(::open(path_.c_str(), kFlags | O_DIRECT, 0644));
    direct_ = static_cast<bool>(fd_);  // EINVAL: this filesystem has no direct I/O
  }
  if (!fd_) fd_.reset(::open(path_.c_str(), kFlags, 0644));
  if (!fd_) throw IoError("cannot create " + path_.string() + ": " + errno_text());
  if (hashing == Hashing::kSha256) hash_.emplace();
}

void ChunkedFile::check_next(uint64_t offset, size_t size) const {
  if (!fd_) throw ProtocolError("a chunk of " + path_.string() + " after its end");
  if (offset != written_ || size > size_ - written_) {
    throw ProtocolError("a chunk of " + path_.string() + " out of order or past its size (offset " +
                        std::to_string(offset) + ", " + std::to_string(size) + " bytes)");
  }
}

void ChunkedFile::write(uint64_t offset, const void* data, size_t size) {
  check_next(offset, size);
  if (hash_) hash_->update(data, size);
  const auto* bytes = static_cast<const char*>(data);
  if (direct_) {
    write_direct(bytes, size);
  } else {
    write_whole(bytes, size);
  }
  wrote(size);
}

// Direct I/O takes whole aligned blocks from aligned memory: the chunk's whole
// blocks go out from an aligned copy (unless the chunk is aligned itself). A
// tail that is not a whole block (a file's last chunk) goes through the page
// cache, and so does the rest of the file, whose offsets are no longer aligned.
void ChunkedFile::write_direct(const char* data, size_t size) {
  size_t whole = size & ~(kDirectAlignment - 1);
  const char* from = data;
  if (reinterpret_cast<uintptr_t>(data) % kDirectAlignment != 0) {
    if (whole > aligned_size_) {
      aligned_.reset(static_cast<char*>(std::aligned_alloc(kDirectAlignment, whole)));
      if (!aligned_) throw IoError("out of memory for a chunk of " + path_.string());
      aligned_size_ = whole;
    }
    std::memcpy(aligned_.get(), data, whole);
    from = aligned_.get();
  }
  write_whole(from, whole);
  if (whole == size) return;
  int flags = ::fcntl(fd_.get(), F_GETFL);
  if (flags < 0 || ::fcntl(fd_.get(), F_SETFL, flags & ~O_DIRECT) < 0) {
    throw IoError("cannot write " + path_.string() + ": " + errno_text());
  }
  direct_ = false;
  write_whole(data + whole, size - whole);
}

void ChunkedFile::write_from(int source, uint64_t offset, const void* data, size_t size) {
  check_next(offset, size);
  if (hash_) hash_->update(data, size);
  auto from = static_cast<loff_t>(offset);
  auto to = static_cast<loff_t>(offset);
  size_t done = 0;
  while (in_kernel_ && done < size) {
    ssize_t n = ::copy_file_range(source, &from, fd_.get(), &to, size - done, 0);
    if (n > 0) {
      done += static_cast<size_t>(n);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && (errno == EXDEV || errno == EINVAL || errno == ENOSYS ||
                         errno == EOPNOTSUPP || errno == EBADF)) {
      in_kernel_ = false;  // another filesystem, or no support: through memory from here on
      if (::lseek(fd_.get(), static_cast<off_t>(offset + done), SEEK_SET) < 0) {
        throw IoError("cannot write " + path_.string() + ": " + errno_text());
      }
    } else {
      throw IoError("cannot write " + path_.string() + ": " +
                    (n < 0 ? errno_text() : std::string("the source ended early")));
    }
  }
  if (done < size) write_whole(static_cast<const char*>(data) + done, size - done);
  wrote(size);
}

void ChunkedFile::write_whole(const char* data, size_t size) {
  if (!write_all(fd_.get(), std::string_view(data, size))) {
    throw IoError("cannot write " + path_.string() + ": " + errno_text());
  }
}

void ChunkedFile::wrote(size_t size) {
  written_ += size;
  if (direct_) flushed_ = written_;  // nothing of it waits in the page cache
  if (written_ - flushed_ >= kWriteBehind) {
    write_behind(fd_.get(), flushed_, written_);
    flushed_ = written_;
  }
}

std::string ChunkedFile::finish() {
  if (!complete()) {
    throw ProtocolError(path_.string() + " ended after " + std::to_string(written_) + " of " +
                        std::to_string(size_) + " bytes");
  }
  bool synced = ::fsync(fd_.get()) == 0;
  auto reason = errno_text();
  fd_.reset();
  if (!synced) throw IoError("cannot write " + path_.string() + ": " + reason);
  return hash_ ? hash_->hex_digest() : std::string();
}

}  // namespace trainrun
