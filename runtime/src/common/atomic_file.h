#pragma once

#include <filesystem>
#include <string_view>

namespace trainrun {

/// Replaces `path` with `content` atomically: writes a temporary file beside it,
/// fsyncs it, renames it over `path` and fsyncs the directory. A reader sees the
/// old content or the new, never a mix. Throws IoError naming the file.
void write_file_atomic(const std::filesystem::path& path, std::string_view content);

/// Appends `content` to `path` (created if absent) and flushes it to the kernel.
void append_file(const std::filesystem::path& path, std::string_view content);

/// fsync of a file or directory. Throws IoError.
void fsync_path(const std::filesystem::path& path);

/// write(2) of all of `content` to `fd`, retrying short writes; false on error.
bool write_all(int fd, std::string_view content);

}  // namespace trainrun
