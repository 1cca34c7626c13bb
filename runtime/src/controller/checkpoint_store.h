#pragma once

// The run's committed checkpoints and the one being staged. Each rank that
// reports a checkpoint uploads its files into <run>/.staging-checkpoint_NNNNNN/:
// a worker that shares this filesystem copies them there itself (hashing as it
// copies, in its own process), one that does not streams them through the
// controller, which writes them here. The commit writes manifest.json (relative
// path, size, sha256 per file; metrics; iteration; ranks) last, renames the
// directory to checkpoint_NNNNNN and atomically replaces
// checkpoint_state.json. A checkpoint without a manifest was never committed; a
// crash leaves only a staging directory, which the next run removes. The
// formats are storage/run_directory.h's.
//
// A run in object storage (RunObjects) has no rename: each rank uploads its
// files straight to <run>/checkpoint_NNNNNN/, the commit puts manifest.json
// there last, then checkpoint_state.json. A prefix without its manifest was
// never committed: nothing lists, counts or resumes from it, and the next run
// of the name deletes it, with the multipart uploads left under it. A name
// whose upload was abandoned is not used again in the run (a late upload of a
// dead attempt lands nowhere the run reads). Owned by the controller's thread.

#include <trainrun/options.h>
#include <trainrun/result.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "protocol/messages.h"
#include "storage/run_directory.h"
#include "storage/run_objects.h"
#include "transfer/chunked_file.h"

namespace trainrun {

class CheckpointStore {
 public:
  /// Opens the run directory: removes stale staging directories, loads
  /// checkpoint_state.json and finishes or undoes a commit that a crash
  /// stopped (recover()). Throws IoError if the state names a checkpoint that
  /// is missing or has no manifest.
  /// With `objects`, `run_dir` is the local copy of a run in object storage
  /// (RunStorage pulled its checkpoint_state.json), and checkpoints live there.
  explicit CheckpointStore(std::filesystem::path run_dir, CheckpointConfig config = {},
                           RunObjects* objects = nullptr);

  /// The run in object storage, or null.
  RunObjects* objects() const { return objects_; }

  /// The latest committed checkpoint, as checkpoint_state.json names it.
  std::optional<CheckpointInfo> latest() const { return state_.latest_checkpoint(); }

  /// Announces `rank`'s files for the checkpoint being staged and makes room
  /// for them: the staging directory and the files' directories, and with
  /// `stream` the (empty) files. Returns the staging directory. Throws UsageError for an unsafe
  /// path or a file name another rank already gave, IoError when the directory cannot be made; then
  /// nothing stays staged. In object storage: the checkpoint's s3:// URL, which
  /// the rank uploads under itself.
  std::filesystem::path begin_upload(int rank, const std::vector<protocol::CheckpointFile>& files,
                                     bool stream);

  /// Writes a chunk of `rank`'s streamed file number `index` (in begin_upload's
  /// list). Files and chunks come in order. Throws ProtocolError for a chunk out
  /// of order, IoError when it cannot be written.
  void write_chunk(int rank, uint32_t index, uint64_t offset, const void* data, size_t size);

  /// `rank`'s files are all in the staging directory, with these sha256s.
  /// Throws ProtocolError when they are not the files announced, IoError when
  /// one is missing or has another size on disk.
  void finish_upload(int rank, const std::vector<protocol::CheckpointFile>& files);

  /// Whether some rank's files are being staged.
  bool staging() const { return !uploads_.empty(); }
  /// Whether a rank's upload has begun and not finished.
  bool uploading() const;
  /// The ranks with files staged (or being uploaded), in order.
  std::vector<int> staged_ranks() const;

  /// Commits the staged files as the next checkpoint, then deletes the
  /// checkpoints that retention no longer keeps. Throws IoError; then the
  /// staging directory is removed and every earlier checkpoint stays as it was.
  CheckpointInfo commit(int64_t iteration, const nlohmann::json& metrics);

  /// Drops the staged files.
  void abort_staging();
  /// Drops the staged files, and stages the next ones under a name of this
  /// attempt's: a worker of a failed attempt that copies late writes nowhere
  /// the new attempt reads.
  void begin_attempt(int attempt);

 private:
  std::filesystem::path staging_dir() const;
  /// Finishes or undoes what a crash left of a commit.
  void recover();
  /// The same in object storage: adopts a committed checkpoint the state does
  /// not name yet, deletes every other unlisted one and aborts the multipart
  /// uploads left under them.
  void recover_objects();
  /// Sets each listed checkpoint's path: its s3:// URL in object storage.
  void locate(run_directory::CheckpointState& state) const;
  void commit_files(const std::string& name, const run_directory::Manifest& manifest);
  /// Throws UsageError when `path` of `rank` is a file where another rank has
  /// a directory, or the other way round.
  void check_no_file_dir_clash(int rank, const std::string& path);
  /// The names retention keeps of `checkpoints`: the best num_to_keep by
  /// score, and the latest.
  std::vector<std::string> kept(const std::vector<CheckpointInfo>& checkpoints) const;

  std::filesystem::path run_dir_;
  CheckpointConfig config_;
  run_directory::CheckpointState state_;
  struct RankUpload {
    std::vector<protocol::CheckpointFile> files;
    bool finished = false;
    uint32_t streaming = 0;             // the streamed file being written
    std::unique_ptr<ChunkedFile> file;  // ... while it is open
  };
  std::map<int, RankUpload> uploads_;  // by rank
  std::map<std::string, int> names_;   // relative path -> rank
  std::map<std::string, int> dirs_;    // directory of some rank's file -> rank
  std::string staging_suffix_;         // ".attempt-N" after the first attempt
  RunObjects* objects_;
};

}  // namespace trainrun
