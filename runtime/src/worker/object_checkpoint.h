#pragma once

// The checkpoint to resume from, when it is in object storage: downloaded
// once per host into <cache_dir>/checkpoints/<digest>/ for every local rank.
// The first rank to take the directory's lock (flock, dropped by the kernel
// however the process ends) downloads each file in parallel ranged reads and
// checks its sha256 against the manifest; the others wait for the lock and
// find it complete. Each user holds a shared lock while the process lives, so
// that a later download may delete the directories nobody uses. Filesystem
// and S3 only; safe from any thread.

#include <filesystem>
#include <string>

#include "common/fd.h"

namespace trainrun {

class ObjectCheckpoint {
 public:
  /// Makes the checkpoint at `url` (s3://.../checkpoint_NNNNNN) local under
  /// `cache_dir`. Throws IoError (S3Error) when it cannot be read or a file
  /// arrives corrupt, UsageError for an unsafe path in its manifest.
  ObjectCheckpoint(const std::string& url, const std::filesystem::path& cache_dir);

  /// The local copy, with the checkpoint's files and manifest.json.
  const std::filesystem::path& dir() const { return dir_; }

 private:
  std::filesystem::path dir_;
  Fd in_use_;  // the shared lock held while this process may read dir_
};

}  // namespace trainrun
