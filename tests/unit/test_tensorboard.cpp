#include <trainrun/error.h>

#include <doctest/doctest.h>
#include <sys/resource.h>

#include <cmath>
#include <csignal>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

#include "temp_dir.h"
#include "tensorboard/event_writer.h"
#include "tensorboard/tensorboard.pb.h"

using trainrun::TensorBoardWriter;
using trainrun::tensorboard::Event;

namespace {

uint64_t read_le(const std::string& bytes, size_t at, int size) {
  uint64_t value = 0;
  for (int i = 0; i < size; ++i) {
    value |= uint64_t{static_cast<unsigned char>(bytes[at + i])} << (8 * i);
  }
  return value;
}

// Every record of an event file, its framing and both checksums checked as
// TensorBoard's reader checks them.
std::vector<Event> read_events(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<Event> events;
  size_t at = 0;
  while (at < bytes.size()) {
    REQUIRE(at + 12 <= bytes.size());
    uint64_t length = read_le(bytes, at, 8);
    CHECK(read_le(bytes, at + 8, 4) == trainrun::masked_crc32c(bytes.data() + at, 8));
    REQUIRE(at + 12 + length + 4 <= bytes.size());
    std::string data = bytes.substr(at + 12, length);
    CHECK(read_le(bytes, at + 12 + length, 4) == trainrun::masked_crc32c(data.data(), length));
    REQUIRE(events.emplace_back().ParseFromString(data));
    at += 12 + length + 4;
  }
  return events;
}

// A file size limit for this process, as a full disk would refuse writes
// (EFBIG instead of ENOSPC); SIGXFSZ ignored so that the write fails instead
// of the process dying. Both restored on leaving.
struct FileSizeLimit {
  rlimit saved{};
  void (*saved_handler)(int);
  explicit FileSizeLimit(rlim_t bytes) : saved_handler(std::signal(SIGXFSZ, SIG_IGN)) {
    ::getrlimit(RLIMIT_FSIZE, &saved);
    rlimit limit{bytes, saved.rlim_max};
    ::setrlimit(RLIMIT_FSIZE, &limit);
  }
  ~FileSizeLimit() {
    ::setrlimit(RLIMIT_FSIZE, &saved);
    std::signal(SIGXFSZ, saved_handler);
  }
};

}  // namespace

TEST_CASE("masked CRC-32C matches the standard check value") {
  // CRC-32C("123456789") is 0xE3069283 (RFC 3720, B.4); masked:
  // ((0xE3069283 >> 15) | (0xE3069283 << 17)) + 0xa282ead8 = 0xc78ab0e5.
  CHECK(trainrun::masked_crc32c("123456789", 9) == 0xc78ab0e5u);
  // The empty input's CRC is 0, so only the mask's offset is left.
  CHECK(trainrun::masked_crc32c("", 0) == 0xa282ead8u);
}

TEST_CASE("an event file reads back: the version first, then one event per report") {
  TempDir dir;
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  std::filesystem::path path;
  {
    TensorBoardWriter writer(dir.path / "tb");  // created with its parent
    path = writer.path();
    CHECK(path.parent_path() == dir.path / "tb");
    CHECK(path.filename().string().rfind("events.out.tfevents.", 0) == 0);
    writer.add_scalars(1, 1700000000.5, {{"loss", 0.25}, {"accuracy", 0.5}});
    writer.add_scalars(2, 1700000001.5, {{"loss", nan}, {"accuracy", -inf}});
    // Flushed as written: all three records are there while the writer is open.
    CHECK(read_events(path).size() == 3);
  }
  auto events = read_events(path);
  REQUIRE(events.size() == 3);
  CHECK(events[0].file_version() == "brain.Event:2");
  CHECK(events[0].wall_time() > 1.6e9);

  CHECK(events[1].step() == 1);
  CHECK(events[1].wall_time() == 1700000000.5);
  REQUIRE(events[1].summary().value_size() == 2);
  CHECK(events[1].summary().value(0).tag() == "loss");
  CHECK(events[1].summary().value(0).simple_value() == 0.25f);
  CHECK(events[1].summary().value(1).tag() == "accuracy");
  CHECK(events[1].summary().value(1).simple_value() == 0.5f);

  CHECK(events[2].step() == 2);
  REQUIRE(events[2].summary().value_size() == 2);
  CHECK(std::isnan(events[2].summary().value(0).simple_value()));
  CHECK(events[2].summary().value(1).simple_value() == -std::numeric_limits<float>::infinity());
}

TEST_CASE("two writers in one directory in the same second write two files") {
  TempDir dir;
  TensorBoardWriter first(dir.path);
  TensorBoardWriter second(dir.path);
  CHECK(first.path() != second.path());
  first.add_scalars(1, 1.0, {{"loss", 1.0}});
  CHECK(read_events(first.path()).size() == 2);
  CHECK(read_events(second.path()).size() == 1);
}

TEST_CASE("a directory that cannot be made is an IoError naming it") {
  TempDir dir;
  std::ofstream(dir.path / "file") << "not a directory";
  auto bad = dir.path / "file" / "tb";
  auto expected = "cannot create TensorBoard directory " + bad.string();
  CHECK_THROWS_WITH_AS(TensorBoardWriter{bad}, doctest::Contains(expected.c_str()),
                       trainrun::IoError);
}

TEST_CASE("a full disk is an IoError, and nothing is written after the torn record") {
  TempDir dir;
  TensorBoardWriter writer(dir.path);
  uintmax_t size_at_failure = 0;
  {
    FileSizeLimit limit(4096);
    auto fill_the_disk = [&] {
      for (int step = 0; step < 100; ++step) {
        writer.add_scalars(step, 0, {{std::string(500, 'x'), 1.0}});
      }
    };
    auto expected = "cannot write TensorBoard event file " + writer.path().string();
    CHECK_THROWS_WITH_AS(fill_the_disk(), doctest::Contains(expected.c_str()), trainrun::IoError);
    size_at_failure = std::filesystem::file_size(writer.path());
  }
  // Room again, but a reader would never get past the torn record: refused.
  CHECK_THROWS_WITH_AS(writer.add_scalars(1000, 0, {{"loss", 1.0}}),
                       doctest::Contains("closed after a failed write"), trainrun::IoError);
  CHECK(std::filesystem::file_size(writer.path()) == size_at_failure);
}
