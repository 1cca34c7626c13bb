#pragma once

// Taking a checkpoint directory from the train function for an asynchronous
// upload: it is renamed beside itself, out of the caller's way, and from then
// on belongs to the worker, which deletes it once uploaded. A process-wide
// list of what was handed over lets the worker delete what it never uploaded
// on its way out, and a hand-over deletes what workers of this host that were
// killed left in the same directory. Filesystem only; safe from any thread.

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace trainrun {

/// A directory that must not be handed over, nor one that holds it.
struct KeptDirectory {
  std::filesystem::path path;  // empty: nothing to keep
  std::string what;            // "the run directory", ...
  bool inside_too = true;      // false: one inside it may be handed over
};

/// Takes `dir` from the train function: renames it within its parent to
/// <name>.trainrun-upload-<host>-<pid>-<iteration> and returns that path
/// (first deleting what workers of this host that are gone left there).
/// Throws UsageError, leaving it where it was, for a symbolic link, something
/// not a directory, one inside a kept directory or holding one (or one being
/// uploaded), or one that cannot be renamed.
std::filesystem::path hand_over_checkpoint(const std::filesystem::path& dir, int64_t iteration,
                                           const std::vector<KeptDirectory>& kept);

/// Gives a handed-over directory back to where it was (a report that could not
/// go out). Best effort.
void give_back_checkpoint(const std::filesystem::path& handed_over,
                          const std::filesystem::path& dir);

/// Deletes a handed-over directory (uploaded, or never to be).
void remove_handed_over_checkpoint(const std::filesystem::path& dir);

/// Deletes every directory handed over and not yet uploaded: the process is
/// ending.
void remove_handed_over_checkpoints();

}  // namespace trainrun
