#include "tensorboard/event_writer.h"

#include <trainrun/error.h>

#include <boost/crc.hpp>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <system_error>

#include "tensorboard/tensorboard.pb.h"

namespace trainrun {
namespace {

// TensorBoard reads a file whose first event says this; 2 is the version
// every TensorFlow since 0.x writes.
constexpr const char* kFileVersion = "brain.Event:2";

double seconds_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// Seconds, host and pid as TensorFlow names the file; the per-process count
// keeps two writers opened in the same second apart.
std::string event_file_name() {
  static std::atomic<int> count{0};
  char host[256] = {};
  if (::gethostname(host, sizeof(host) - 1) != 0) std::strcpy(host, "localhost");
  auto seconds = std::chrono::duration_cast<std::chrono::seconds>(
                     std::chrono::system_clock::now().time_since_epoch())
                     .count();
  return "events.out.tfevents." + std::to_string(seconds) + "." + host + "." +
         std::to_string(::getpid()) + "." + std::to_string(count++);
}

void append_le(std::string& out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>(value >> (8 * i)));
}

}  // namespace

uint32_t masked_crc32c(const void* data, size_t size) {
  boost::crc_optimal<32, 0x1EDC6F41, 0xFFFFFFFF, 0xFFFFFFFF, true, true> crc;
  crc.process_bytes(data, size);
  uint32_t value = crc.checksum();
  return ((value >> 15) | (value << 17)) + 0xa282ead8u;
}

TensorBoardWriter::TensorBoardWriter(const std::filesystem::path& dir) {
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error) {
    throw IoError("cannot create TensorBoard directory " + dir.string() + ": " + error.message());
  }
  path_ = dir / event_file_name();
  // "x": O_EXCL, so a name that is somehow taken fails rather than truncating
  // another writer's file; "e": O_CLOEXEC, kept from the workers we spawn.
  file_.reset(std::fopen(path_.c_str(), "wbxe"));
  if (!file_) fail("cannot create");

  tensorboard::Event event;
  event.set_wall_time(seconds_now());
  event.set_file_version(kFileVersion);
  write_record(event.SerializeAsString());
  flush();
}

void TensorBoardWriter::add_scalars(int64_t step, double wall_time,
                                    const std::vector<std::pair<std::string, double>>& scalars) {
  tensorboard::Event event;
  event.set_wall_time(wall_time);
  event.set_step(step);
  auto* summary = event.mutable_summary();
  for (const auto& [tag, value] : scalars) {
    auto* entry = summary->add_value();
    entry->set_tag(tag);
    entry->set_simple_value(static_cast<float>(value));
  }
  write_record(event.SerializeAsString());
  flush();
}

void TensorBoardWriter::flush() {
  check_open();
  if (std::fflush(file_.get()) != 0) fail("cannot write");
}

// TFRecord: length (8 bytes, little-endian), its masked CRC, the data, the
// data's masked CRC. One fwrite, so a failure leaves at most this record torn.
void TensorBoardWriter::write_record(const std::string& data) {
  check_open();
  std::string record;
  record.reserve(data.size() + 16);
  append_le(record, data.size(), 8);
  append_le(record, masked_crc32c(record.data(), 8), 4);
  record += data;
  append_le(record, masked_crc32c(data.data(), data.size()), 4);
  if (std::fwrite(record.data(), 1, record.size(), file_.get()) != record.size()) {
    fail("cannot write");
  }
}

void TensorBoardWriter::check_open() const {
  if (!file_) {
    throw IoError("TensorBoard event file " + path_.string() +
                  " was closed after a failed write; open a new writer to go on");
  }
}

void TensorBoardWriter::fail(const char* what) {
  // The message first: closing may change errno. Closing may also write more
  // of the torn record, but nothing is ever appended after it.
  std::string message =
      std::string(what) + " TensorBoard event file " + path_.string() + ": " + std::strerror(errno);
  file_.reset();
  throw IoError(message);
}

}  // namespace trainrun
