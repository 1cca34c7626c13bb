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

/// Reports metrics together with a checkpoint. Every rank that passes one has
/// its files merged into one committed checkpoint_NNNNNN in the run's storage
/// (the same file name from two ranks is an error naming both; name per-rank
/// shards, e.g. "model-rank=1.pt"). Returns once the checkpoint is committed,
/// so the directory may be deleted afterwards. A barrier, like report(metrics).
void report(const Metrics& metrics, const Checkpoint& checkpoint);

/// The latest committed checkpoint of this run (after a restart, or a rerun of
/// the same run name), or nothing. Its files were checked against the
/// checkpoint's manifest; read them, do not change them. Throws
/// std::runtime_error if the checkpoint is damaged.
std::optional<Checkpoint> get_checkpoint();

}  // namespace train
