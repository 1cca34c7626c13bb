#pragma once

#include <filesystem>
#include <string_view>
#include <utility>

#include "common/fd.h"

namespace trainrun {

/// Whether a replaced file must survive a power cut, or only never be seen
/// half-written (a page derived from other records).
enum class Durability { kSynced, kUnsynced };

/// Replaces `path` with `content` atomically: writes a temporary file beside it,
/// fsyncs it, renames it over `path` and fsyncs the directory (kUnsynced: no
/// fsyncs). A reader sees the old content or the new, never a mix. Throws
/// IoError naming the file.
void write_file_atomic(const std::filesystem::path& path, std::string_view content,
                       Durability durability = Durability::kSynced);

/// A file appended to many times, kept open between appends (a file per
/// report would otherwise cost an open and a close each). Reopen it after the
/// file has been replaced by a rename. Not thread-safe.
class AppendFile {
 public:
  explicit AppendFile(std::filesystem::path path) : path_(std::move(path)) {}
  AppendFile(const AppendFile&) = delete;
  AppendFile& operator=(const AppendFile&) = delete;

  /// Appends `content` (created if absent) and hands it to the kernel. Throws IoError.
  void append(std::string_view content);
  /// Closes the file; the next append opens it again.
  void close();

 private:
  std::filesystem::path path_;
  Fd fd_;
};

/// fsync of a file or directory. Throws IoError.
void fsync_path(const std::filesystem::path& path);

/// write(2) of all of `content` to `fd`, retrying short writes; false on error.
bool write_all(int fd, std::string_view content);

}  // namespace trainrun
