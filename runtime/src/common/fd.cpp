#include "common/fd.h"

#include <trainrun/error.h>

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

namespace trainrun {

void Fd::reset(int fd) noexcept {
  if (fd_ >= 0) {
    int saved = errno;
    ::close(fd_);
    errno = saved;
  }
  fd_ = fd;
}

int Fd::close() { return ::close(release()); }

std::pair<Fd, Fd> make_pipe(int flags, std::string_view what) {
  int ends[2];
  if (::pipe2(ends, O_CLOEXEC | flags) != 0) {
    throw IoError("cannot create " + std::string(what) + ": " + std::strerror(errno));
  }
  return {Fd(ends[0]), Fd(ends[1])};
}

}  // namespace trainrun
