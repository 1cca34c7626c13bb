#include "common/atomic_file.h"

#include <trainrun/error.h>

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

namespace trainrun {
namespace {

[[noreturn]] void fail(const std::string& what, const std::filesystem::path& path) {
  throw IoError(what + " " + path.string() + ": " + std::strerror(errno));
}

}  // namespace

bool write_all(int fd, std::string_view content) {
  while (!content.empty()) {
    ssize_t n = ::write(fd, content.data(), content.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    content.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

void fsync_path(const std::filesystem::path& path) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) fail("cannot open", path);
  if (::fsync(fd.get()) != 0) fail("cannot fsync", path);
}

void write_file_atomic(const std::filesystem::path& path, std::string_view content,
                       Durability durability) {
  const bool durable = durability == Durability::kSynced;
  auto temp = path;
  temp += ".tmp." + std::to_string(::getpid());
  {
    Fd fd(::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    if (!fd) fail("cannot create", temp);
    if (!write_all(fd.get(), content) || (durable && ::fsync(fd.get()) != 0)) {
      int saved = errno;
      ::unlink(temp.c_str());
      errno = saved;
      fail("cannot write", temp);
    }
    if (fd.close() != 0) fail("cannot close", temp);
  }
  if (::rename(temp.c_str(), path.c_str()) != 0) {
    int saved = errno;
    ::unlink(temp.c_str());
    errno = saved;
    fail("cannot rename into place", path);
  }
  if (durable) {
    fsync_path(path.has_parent_path() ? path.parent_path() : std::filesystem::path("."));
  }
}

void AppendFile::append(std::string_view content) {
  if (!fd_) fd_.reset(::open(path_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644));
  if (!fd_) fail("cannot open", path_);
  if (!write_all(fd_.get(), content)) fail("cannot write", path_);
}

void AppendFile::close() { fd_.reset(); }

}  // namespace trainrun
