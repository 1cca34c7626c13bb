#pragma once

// Checkpoint files on the move: listing a rank's directory, checking a path
// a peer names, and copying a file with its hash. Used by the worker (copying
// or streaming its files) and by the controller (checking what is announced).

#include <filesystem>
#include <string>
#include <vector>

#include "protocol/messages.h"

namespace trainrun {

/// The regular files under `dir`, sorted, with their sizes (no sha256 yet).
/// Throws UsageError naming `rank` for a symbolic link or anything that is not
/// a file or a directory, IoError when `dir` cannot be listed.
std::vector<protocol::CheckpointFile> list_checkpoint_files(const std::filesystem::path& dir,
                                                            int rank);

/// Whether `path` may name a file inside a checkpoint: relative, and without
/// empty, "." or ".." components.
bool is_safe_checkpoint_path(const std::string& path);

/// Copies `from` to `to` (created or replaced) and returns the sha256 of what it
/// copied. The source is read once, mapped; write-back of the copy starts as it
/// goes and the copy is fsynced. Throws IoError naming the file.
std::string copy_and_hash(const std::filesystem::path& from, const std::filesystem::path& to);

}  // namespace trainrun
