#include "data/sources/file.h"

#include <train/shard_files.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace train::sources {

LocalFile::LocalFile(std::string path) : path_(std::move(path)) {
  fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  struct stat st {};
  if (fd_ < 0 || ::fstat(fd_, &st) != 0) {
    const int error = errno;
    if (fd_ >= 0) ::close(fd_);
    throw ShardError("cannot open shard " + path_ + ": " + std::strerror(error));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd_);
    throw ShardError("shard " + path_ + " is not a file");
  }
  size_ = static_cast<uint64_t>(st.st_size);
}

LocalFile::~LocalFile() {
  if (fd_ >= 0) ::close(fd_);
}

void LocalFile::read(uint64_t offset, uint64_t length, char* out) const {
  if (offset > size_ || length > size_ - offset) {
    throw ShardError("shard " + path_ + " has " + std::to_string(size_) + " bytes, not the " +
                     std::to_string(offset + length) + " its index needs (a stale index: run "
                     "`trainrun index` on it)");
  }
  uint64_t done = 0;
  while (done < length) {
    const ssize_t n = ::pread(fd_, out + done, length - done,
                              static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw ShardError("cannot read shard " + path_ + ": " + std::strerror(errno));
    if (n == 0) {
      throw ShardError("shard " + path_ + " ends at byte " + std::to_string(offset + done) +
                       ", before the " + std::to_string(offset + length) +
                       " its index needs (truncated since it was indexed)");
    }
    done += static_cast<uint64_t>(n);
  }
}

void LocalFile::will_need(uint64_t offset, uint64_t length) const {
  (void)::posix_fadvise(fd_, static_cast<off_t>(offset), static_cast<off_t>(length),
                        POSIX_FADV_WILLNEED);
}

LocalFile::Mapping::~Mapping() {
  if (size_ > 0) ::munmap(const_cast<void*>(data_), size_);
}

LocalFile::Mapping LocalFile::map() const {
  if (size_ == 0) return Mapping(nullptr, 0);
  void* data = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd_, 0);
  if (data == MAP_FAILED) {
    throw ShardError("cannot map shard " + path_ + ": " + std::strerror(errno));
  }
  return Mapping(data, size_);
}

}  // namespace train::sources
