#pragma once

// Taking a checkpoint directory from the train function for an asynchronous
// upload: it is renamed beside itself, out of the caller's way, and from then
// on belongs to the worker, which deletes it once uploaded. A process-wide
// list of what was handed over lets the worker delete what it never uploaded
// on its way out; a lock file beside each directory, held while it is in use,
// lets a later hand-over in the same directory delete what a killed worker
// left. Filesystem only; safe from any thread.

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

/// A directory handed over: where it is now, and where it was.
struct HandedOver {
  std::filesystem::path dir;     // <name>.trainrun-upload-<host>-<pid>-<iteration>
  std::filesystem::path source;  // normalised, its parent's links resolved
};

/// Takes `dir` from the train function: renames it within its parent to
/// <name>.trainrun-upload-<host>-<pid>-<iteration>, beside a lock file of the
/// same name plus ".lock" that this process holds (flock) until the directory
/// is deleted. First deletes what processes that are gone handed over in the
/// same parent (their lock files are free). Throws UsageError, leaving it
/// where it was, for a symbolic link, something not a directory, the root, a
/// run directory or committed checkpoint or anything inside one, one inside a
/// kept directory or holding one (or one being uploaded), or one that cannot
/// be renamed.
HandedOver hand_over_checkpoint(const std::filesystem::path& dir, int64_t iteration,
                                const std::vector<KeptDirectory>& kept);

/// Gives a handed-over directory back to where it was (a report that could not
/// go out). False when it could not: it stays where it is, no longer this
/// process's to delete.
bool give_back_checkpoint(const HandedOver& handed);

/// Deletes a handed-over directory (uploaded, or never to be).
void remove_handed_over_checkpoint(const std::filesystem::path& dir);

/// Deletes every directory handed over and not yet uploaded: the process is
/// ending.
void remove_handed_over_checkpoints();

}  // namespace trainrun
