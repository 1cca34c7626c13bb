#include <doctest/doctest.h>
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <utility>

#include "common/fd.h"

using namespace trainrun;

namespace {

bool is_open(int fd) { return ::fcntl(fd, F_GETFD) != -1; }

// Checked right after the close, before anything could take the number again.
bool is_closed(int fd) {
  errno = 0;
  return ::fcntl(fd, F_GETFD) == -1 && errno == EBADF;
}

}  // namespace

TEST_CASE("a moved Fd leaves the descriptor open for its new owner") {
  auto [read_end, write_end] = make_pipe(0, "a test pipe");
  const int number = read_end.get();
  Fd owner;
  {
    Fd between(std::move(read_end));
    CHECK_FALSE(read_end);
    owner = std::move(between);
    CHECK_FALSE(between);
    CHECK(between.get() == -1);
  }  // the moved-from ones end here, closing nothing
  REQUIRE(owner.get() == number);
  CHECK(is_open(number));
  // Still the same pipe.
  char byte = 'x';
  REQUIRE(::write(write_end.get(), &byte, 1) == 1);
  byte = 0;
  CHECK(::read(owner.get(), &byte, 1) == 1);
  CHECK(byte == 'x');
}

TEST_CASE("an Fd closes its descriptor when destroyed") {
  auto [read_end, write_end] = make_pipe(0, "a test pipe");
  const int number = read_end.get();
  { Fd owner(std::move(read_end)); }
  CHECK(is_closed(number));
  CHECK(is_open(write_end.get()));
}

TEST_CASE("move assignment closes the descriptor an Fd held before") {
  auto [first, first_write] = make_pipe(0, "a test pipe");
  auto [second, second_write] = make_pipe(0, "a test pipe");
  const int first_number = first.get();
  const int second_number = second.get();
  first = std::move(second);
  CHECK(is_closed(first_number));
  CHECK(first.get() == second_number);
  CHECK(is_open(second_number));
  CHECK_FALSE(second);
}

TEST_CASE("release hands the descriptor over without closing it") {
  auto [read_end, write_end] = make_pipe(0, "a test pipe");
  const int number = read_end.get();
  int released = -1;
  {
    Fd owner(std::move(read_end));
    released = owner.release();
    CHECK_FALSE(owner);
  }
  CHECK(released == number);
  CHECK(is_open(number));
  Fd again(released);  // closed by the test's end
}

TEST_CASE("close() and reset() close at once, and close() says how it went") {
  auto [read_end, write_end] = make_pipe(O_NONBLOCK, "a test pipe");
  CHECK((::fcntl(read_end.get(), F_GETFL) & O_NONBLOCK) != 0);
  CHECK((::fcntl(read_end.get(), F_GETFD) & FD_CLOEXEC) != 0);
  const int read_number = read_end.get();
  CHECK(read_end.close() == 0);
  CHECK(is_closed(read_number));
  CHECK_FALSE(read_end);
  CHECK(read_end.close() == -1);  // nothing to close, as close(2) says of a bad descriptor
  const int write_number = write_end.get();
  write_end.reset();
  CHECK(is_closed(write_number));
  CHECK_FALSE(write_end);
}
