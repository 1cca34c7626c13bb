#pragma once

#include <train/report.h>

#include <filesystem>
#include <optional>

namespace train {

/// A directory of files that make up a checkpoint (Ray Train's Checkpoint).
/// Cheap to copy; it names a directory and owns nothing.
class Checkpoint {
 public:
  /// A checkpoint made of the files under `path` (subdirectories included).
  /// Throws std::invalid_argument if `path` is not a directory.
  static Checkpoint from_directory(const std::filesystem::path& path);
  /// The directory holding the checkpoint's files.
  const std::filesystem::path& path() const { return path_; }

 private:
  explicit Checkpoint(std::filesystem::path path) : path_(std::move(path)) {}
  std::filesystem::path path_;
};

/// A fresh, private temporary directory, removed with its contents when the
/// TempDir is destroyed (Python's tempfile.TemporaryDirectory). Throws
/// std::runtime_error if it cannot be created. Not copyable.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

/// How report() uploads a checkpoint (Ray Train's CheckpointUploadMode).
enum class CheckpointUploadMode {
  /// report() returns once the checkpoint is committed; the directory stays
  /// the caller's.
  kSync,
  /// report() returns once every rank has handed its directory over, before
  /// the upload and commit. From the call on the directory belongs to
  /// trainrun: it is moved away at once (renamed, within its parent
  /// directory, to <name>.trainrun-upload-<host>-<pid>-<iteration>), uploaded
  /// in the background and deleted afterwards, so the same path can be
  /// written again for the next checkpoint. A worker killed before it is
  /// uploaded leaves it (with a .lock file beside it); the next hand-over in
  /// the same parent directory deletes it. The checkpoint shows
  /// in result.jsonl,
  /// checkpoint_state.json and get_checkpoint() once committed. At most one
  /// is in flight: the next report() with a checkpoint waits for its commit,
  /// and so does the end of the run. A failed upload or commit fails the run
  /// with the storage error, at the latest at the next report() or the end of
  /// the train function.
  kAsync,
};

/// Reports metrics together with a checkpoint. Every rank that passes one has
/// its files merged into one committed checkpoint_NNNNNN in the run's storage
/// (the same file name from two ranks is an error naming both; name per-rank
/// shards, e.g. "model-rank=1.pt"). A barrier, like report(metrics).
///
/// kSync (the default) returns once the checkpoint is committed, so the
/// directory may be deleted afterwards. kAsync returns once every rank has
/// handed its directory over (see CheckpointUploadMode); every rank passing a
/// checkpoint must pass the same mode. A directory that cannot be handed over
/// is refused with std::runtime_error and stays where it was: a run's
/// directory or a committed checkpoint (of any run) or one inside them, the
/// fetched or resumed checkpoint, one holding the storage root
/// (--storage-path), the working directory or a checkpoint still being
/// uploaded; a symbolic link; or one whose parent directory is not writable.
/// With a trainrun older than this SDK, kAsync uploads as kSync does and
/// leaves the directory where it is.
void report(const Metrics& metrics, const Checkpoint& checkpoint,
            CheckpointUploadMode upload_mode = CheckpointUploadMode::kSync);

/// The latest committed checkpoint of this run (after a restart, or a rerun of
/// the same run name), or nothing. Its files were checked against the
/// checkpoint's manifest; read them, do not change them. Throws
/// std::runtime_error if the checkpoint is damaged.
std::optional<Checkpoint> get_checkpoint();

}  // namespace train
