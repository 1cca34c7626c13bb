#pragma once

// The run's committed checkpoints and the one being staged. A report's files
// are copied from every rank into <run>/.staging-checkpoint_NNNNNN/ (one thread
// per rank, copying and hashing in one pass, so the controller's loop goes on);
// the commit waits for the copies, writes manifest.json (relative path, size, sha256 per file;
// metrics; iteration; ranks) last, renames the directory to checkpoint_NNNNNN
// and atomically replaces checkpoint_state.json. A checkpoint without a
// manifest was never committed; a crash leaves only a staging directory, which
// the next run removes. Owned by the controller's thread; only the copy tasks
// it starts run elsewhere, and they touch nothing but their own files.

#include <trainrun/trainer.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <future>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace trainrun {

struct CommittedCheckpoint {
  std::string name;  // checkpoint_NNNNNN
  std::filesystem::path dir;
  int64_t iteration = 0;
};

class CheckpointStore {
 public:
  /// Opens the run directory: removes stale staging directories and loads
  /// checkpoint_state.json. Throws IoError if the state names a checkpoint that
  /// is missing or has no manifest.
  explicit CheckpointStore(std::filesystem::path run_dir, CheckpointConfig config = {});

  /// The latest committed checkpoint, as checkpoint_state.json names it.
  std::optional<CommittedCheckpoint> latest() const;

  /// Starts copying the files under `source` into the staging directory as
  /// `rank`'s. Throws UsageError at once for an unsafe entry (symlink, device,
  /// socket, fifo) or a file name another rank already gave, IoError when the
  /// staging directory cannot be made; then nothing stays staged. A failed copy
  /// surfaces from commit() as IoError.
  void stage(int rank, const std::filesystem::path& source);
  bool staging() const { return !staged_.empty(); }

  /// Commits the staged files as the next checkpoint, then deletes the
  /// checkpoints that retention no longer keeps. Throws IoError; then the
  /// staging directory is removed and every earlier checkpoint stays as it was.
  CommittedCheckpoint commit(int64_t iteration, const nlohmann::json& metrics);

  /// Drops the staged files.
  void abort_staging();

 private:
  std::filesystem::path staging_dir() const;
  /// stage() without the clean-up on failure.
  void start_copy(int rank, const std::filesystem::path& source);
  /// The names retention keeps: the best num_to_keep by score, and the latest.
  std::vector<std::string> kept(const nlohmann::json& checkpoints) const;

  std::filesystem::path run_dir_;
  CheckpointConfig config_;
  nlohmann::json state_;  // {"checkpoints": [...], "latest": name, "next_index": n}
  struct StagedFile {
    std::string relative;
    int rank = 0;
    uint64_t size = 0;
    std::string sha256;
  };
  std::map<std::string, int> staged_;                         // relative path -> rank
  std::vector<std::future<std::vector<StagedFile>>> copies_;  // one per staged rank
};

/// Whether checkpoint `a` ranks before `b` (entries of checkpoint_state.json:
/// name, iteration, metrics): by the score attribute, those without it last,
/// or else the more recent first.
bool ranks_before(const nlohmann::json& a, const nlohmann::json& b, const CheckpointConfig& config);

/// Checks every file of a committed checkpoint against its manifest (size and
/// sha256). Throws IoError naming the first file that differs or is missing.
void verify_checkpoint(const std::filesystem::path& dir);

}  // namespace trainrun
