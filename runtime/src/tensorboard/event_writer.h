#pragma once

// A TensorBoard event file of scalar metrics, so that `tensorboard --logdir`
// charts a run while it goes. The writer owns one new file and appends a
// TFRecord per call, flushed as it is written; it is not thread-safe (one
// thread writes the reports as they are released). After a failed write the
// file may end in a partial record, which TensorBoard would never read past,
// so the writer refuses further writes: make a new one (a new file) to go on.

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace trainrun {

/// TFRecord's checksum of `size` bytes at `data`: CRC-32C (Castagnoli),
/// masked as TFRecord masks it, ((crc >> 15) | (crc << 17)) + 0xa282ead8.
uint32_t masked_crc32c(const void* data, size_t size);

/// Writes scalar events into `events.out.tfevents.<seconds>.<host>.<pid>.<n>`,
/// the name TensorBoard looks for in a log directory.
class TensorBoardWriter {
 public:
  /// Creates `dir` and its parents if missing, then a new event file in it
  /// (never an existing one), and writes the file's version record. Throws
  /// IoError naming the directory or the file.
  explicit TensorBoardWriter(const std::filesystem::path& dir);

  /// Writes one event at `step` holding one scalar per (tag, value), and
  /// flushes it. Values are stored as float, TensorBoard's scalar type; NaN and
  /// infinities are kept as they are. Throws IoError naming the file.
  void add_scalars(int64_t step, double wall_time,
                   const std::vector<std::pair<std::string, double>>& scalars);
  /// Hands what is buffered to the kernel. Throws IoError naming the file.
  void flush();
  /// The event file.
  const std::filesystem::path& path() const { return path_; }

  // Destroying the writer closes the file. A close has nothing left to write
  // (every call flushed), so no error is lost there.

 private:
  struct CloseFile {
    void operator()(std::FILE* file) const { std::fclose(file); }
  };

  void write_record(const std::string& data);
  void check_open() const;
  [[noreturn]] void fail(const char* what);

  std::filesystem::path path_;
  std::unique_ptr<std::FILE, CloseFile> file_;
};

}  // namespace trainrun
