#pragma once

// A file descriptor with one owner, closed when that owner lets it go.
// Descriptors change hands in the runtime (a worker's pipes go from
// spawn_local_worker through LocalWorker to the WorkerOutput or node agent that
// reads them; a pidfd lives in its WorkerSlot): an Fd moved out of holds
// nothing, so a descriptor is closed once, by its last holder, and never after
// its number has been reused. Not thread-safe, like the int it wraps.

#include <string_view>
#include <utility>

namespace trainrun {

class Fd {
 public:
  /// Holds no descriptor.
  Fd() = default;
  /// Owns `fd`; a negative one (a failed open's -1) means none.
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() { reset(); }
  /// Takes `other`'s descriptor, leaving it empty.
  Fd(Fd&& other) noexcept : fd_(other.release()) {}
  /// Closes the descriptor held, then takes `other`'s, leaving it empty.
  Fd& operator=(Fd&& other) noexcept {
    reset(other.release());
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;

  /// The descriptor, still owned here; -1 when none.
  int get() const { return fd_; }
  /// Whether it holds a descriptor.
  explicit operator bool() const { return fd_ >= 0; }
  /// Gives the descriptor up without closing it; the caller closes it.
  int release() { return std::exchange(fd_, -1); }
  /// Closes the descriptor held (errno is left as it was: a caller about to
  /// report an earlier failure still reads its errno), then owns `fd`.
  void reset(int fd = -1) noexcept;
  /// Closes the descriptor now and returns close(2)'s result, for a file whose
  /// close must be checked (a write may fail only there, on NFS). Holding none,
  /// -1 with EBADF, as close(2) says.
  int close();

 private:
  int fd_ = -1;
};

/// A pipe's read and write ends, O_CLOEXEC with `flags` (pipe2). Throws IoError
/// "cannot create <what>: <reason>".
std::pair<Fd, Fd> make_pipe(int flags, std::string_view what);

}  // namespace trainrun
