#include "controller/checkpoint_store.h"

#include <trainrun/error.h>

#include <algorithm>
#include <map>
#include <vector>

#include "common/atomic_file.h"
#include "common/crash_point.h"
#include "transfer/checkpoint_files.h"

namespace trainrun {

using run_directory::checkpoint_name;
using run_directory::kManifestFile;
using run_directory::kStagingPrefix;

CheckpointStore::CheckpointStore(std::filesystem::path run_dir, CheckpointConfig config,
                                 RunObjects* objects)
    : run_dir_(std::move(run_dir)), config_(std::move(config)), objects_(objects) {
  if (objects_ != nullptr) {
    state_ = run_directory::read_checkpoint_state(run_dir_);
    recover_objects();
    locate(state_);
    if (!state_.latest.empty() &&
        !objects_->client().head(objects_->key(state_.latest + "/" + kManifestFile))) {
      throw IoError(objects_->url(run_directory::kCheckpointStateFile) + " names checkpoint " +
                    state_.latest + ", which is missing or was never committed (no " +
                    kManifestFile + ")");
    }
    return;
  }
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(run_dir_, ec)) {
    if (entry.path().filename().string().rfind(kStagingPrefix, 0) == 0) {
      std::filesystem::remove_all(entry.path(), ec);  // a commit that never finished
    }
  }
  state_ = run_directory::read_checkpoint_state(run_dir_);  // throws IoError when malformed
  recover();
  if (!state_.latest.empty() &&
      !std::filesystem::exists(run_dir_ / state_.latest / kManifestFile)) {
    throw IoError((run_dir_ / run_directory::kCheckpointStateFile).string() + " names checkpoint " +
                  state_.latest + ", which is missing or was never committed (no " + kManifestFile +
                  ")");
  }
}

// A crash can stop a commit between any two of its steps; what is on disk then
// decides. A checkpoint_NNNNNN directory the state does not list, at or past
// the state's next index, was renamed into place with its manifest written and
// fsynced first: it is committed, and the state is rebuilt to name it (one
// without a readable manifest was not made by a commit, and is left alone). One
// below the next index that the state no longer lists was dropped by retention
// before the crash could delete it: it goes now.
void CheckpointStore::recover() {
  std::error_code ec;
  std::vector<std::pair<int64_t, std::filesystem::path>> found;
  for (const auto& entry : std::filesystem::directory_iterator(run_dir_, ec)) {
    auto name = entry.path().filename().string();
    auto index = run_directory::checkpoint_index(name);
    if (!index || !entry.is_directory(ec)) continue;
    bool listed = std::any_of(state_.checkpoints.begin(), state_.checkpoints.end(),
                              [&](const CheckpointInfo& c) { return c.name == name; });
    if (!listed) found.emplace_back(*index, entry.path());
  }
  std::sort(found.begin(), found.end());
  bool adopted = false;
  for (const auto& [index, dir] : found) {
    if (index < state_.next_index) {
      std::filesystem::remove_all(dir, ec);
      continue;
    }
    run_directory::Manifest manifest;
    try {
      manifest = run_directory::read_manifest(dir);
    } catch (const IoError&) {
      continue;
    }
    auto name = dir.filename().string();
    state_.checkpoints.push_back({name, dir, manifest.iteration, manifest.metrics});
    state_.latest = name;
    state_.next_index = index + 1;
    adopted = true;
  }
  if (adopted) run_directory::write_checkpoint_state(run_dir_, state_);
}

void CheckpointStore::recover_objects() {
  // checkpoint_NNNNNN/... keys, by checkpoint.
  std::map<int64_t, bool> found;  // index -> has a manifest
  for (const auto& object : objects_->list("checkpoint_")) {
    auto slash = object.key.find('/');
    if (slash == std::string::npos) continue;
    auto index = run_directory::checkpoint_index(object.key.substr(0, slash));
    if (!index) continue;
    found[*index] |= object.key.substr(slash + 1) == kManifestFile;
  }
  bool adopted = false;
  const int64_t before = state_.next_index;
  for (const auto& [index, has_manifest] : found) {
    auto name = checkpoint_name(index);
    bool listed = std::any_of(state_.checkpoints.begin(), state_.checkpoints.end(),
                              [&](const CheckpointInfo& c) { return c.name == name; });
    if (listed) continue;
    if (index >= state_.next_index && has_manifest) {
      auto text = objects_->get(name + "/" + kManifestFile);
      if (text) {
        try {
          auto manifest = run_directory::parse_manifest(*text, objects_->url(name));
          state_.checkpoints.push_back(
              {name, objects_->url(name), manifest.iteration, manifest.metrics});
          state_.latest = name;
          state_.next_index = index + 1;
          adopted = true;
          continue;
        } catch (const IoError&) {
        }
      }
    }
    objects_->discard(name + "/");
  }
  // No name that held objects is used again: a rank of a dead run still
  // uploading there would land in this run's checkpoint.
  if (!found.empty()) state_.next_index = std::max(state_.next_index, found.rbegin()->first + 1);
  // Uploads that no commit will complete: a run of this name is not running.
  for (const auto& upload : objects_->client().list_multipart(objects_->key("checkpoint_"))) {
    objects_->client().abort_multipart(upload.key, upload.upload_id);
  }
  if (adopted || state_.next_index != before) {
    run_directory::write_checkpoint_state(run_dir_, state_);
    objects_->push(run_dir_, run_directory::kCheckpointStateFile);
  }
}

void CheckpointStore::locate(run_directory::CheckpointState& state) const {
  if (objects_ == nullptr) return;
  for (auto& c : state.checkpoints) c.path = objects_->url(c.name);
}

std::filesystem::path CheckpointStore::staging_dir() const {
  if (objects_ != nullptr) return objects_->url(checkpoint_name(state_.next_index));
  return run_dir_ / (kStagingPrefix + checkpoint_name(state_.next_index) + staging_suffix_);
}

void CheckpointStore::begin_attempt(int attempt) {
  abort_staging();
  staging_suffix_ = attempt > 1 ? ".attempt-" + std::to_string(attempt) : "";
}

std::filesystem::path CheckpointStore::begin_upload(
    int rank, const std::vector<protocol::CheckpointFile>& files, bool stream) {
  auto staging = staging_dir();
  try {
    if (uploads_.count(rank) != 0) {
      throw ProtocolError("rank " + std::to_string(rank) + " uploads a checkpoint twice");
    }
    auto& upload = uploads_[rank];
    upload.files = files;
    std::error_code ec;
    if (objects_ == nullptr) std::filesystem::create_directories(staging, ec);
    if (ec) throw IoError("cannot create " + staging.string() + ": " + ec.message());
    for (const auto& file : files) {
      if (!is_safe_checkpoint_path(file.path)) {
        throw UsageError("rank " + std::to_string(rank) + "'s checkpoint names an unsafe path, " +
                         file.path + ": only relative paths inside the checkpoint are allowed");
      }
      if (file.path == kManifestFile) {
        throw UsageError("rank " + std::to_string(rank) + "'s checkpoint has a file named " +
                         kManifestFile +
                         " at its top, a name trainrun keeps for the checkpoint's "
                         "manifest: rename it or put it in a subdirectory");
      }
      if (auto [found, inserted] = names_.emplace(file.path, rank); !inserted) {
        throw UsageError("ranks " + std::to_string(found->second) + " and " + std::to_string(rank) +
                         " both report a checkpoint file named " + file.path +
                         ": give per-rank files distinct names, e.g. model-rank=" +
                         std::to_string(rank) + ".pt");
      }
      check_no_file_dir_clash(rank, file.path);
      if (objects_ != nullptr) continue;  // the rank puts its objects itself
      auto path = staging / file.path;
      std::filesystem::create_directories(path.parent_path(), ec);
      if (ec) throw IoError("cannot create " + path.parent_path().string() + ": " + ec.message());
      if (stream)
        ChunkedFile(path, file.size,
                    ChunkedFile::Hashing::kNone);  // a file with no chunks exists too
    }
  } catch (...) {
    abort_staging();  // this checkpoint cannot be committed: drop every rank's part
    throw;
  }
  return staging;
}

std::vector<int> CheckpointStore::staged_ranks() const {
  std::vector<int> ranks;
  for (const auto& [rank, upload] : uploads_) {
    if (!upload.files.empty()) ranks.push_back(rank);  // an empty directory writes nothing
  }
  return ranks;
}

void CheckpointStore::write_chunk(int rank, uint32_t index, uint64_t offset, const void* data,
                                  size_t size) {
  auto found = uploads_.find(rank);
  if (objects_ != nullptr || found == uploads_.end() || found->second.finished ||
      index >= found->second.files.size() || index < found->second.streaming) {
    throw ProtocolError("UPLOAD_CHUNK for no file rank " + std::to_string(rank) + " is uploading");
  }
  auto& upload = found->second;
  if (!upload.file || index != upload.streaming) {
    if (upload.file) upload.file->finish();  // the previous file ended
    const auto& file = upload.files[index];
    // Nobody reads a checkpoint soon after it is written: around the page cache.
    upload.file =
        std::make_unique<ChunkedFile>(staging_dir() / file.path, file.size,
                                      ChunkedFile::Hashing::kNone, ChunkedFile::Caching::kDirect);
    upload.streaming = index;
  }
  upload.file->write(offset, data, size);
}

void CheckpointStore::finish_upload(int rank, const std::vector<protocol::CheckpointFile>& files) {
  auto found = uploads_.find(rank);
  if (found == uploads_.end() || found->second.finished) {
    throw ProtocolError("UPLOADED from rank " + std::to_string(rank) + ", which is not uploading");
  }
  auto& upload = found->second;
  if (upload.file) upload.file->finish();
  upload.file.reset();
  bool same = files.size() == upload.files.size();
  for (size_t i = 0; same && i < files.size(); ++i) {
    same = files[i].path == upload.files[i].path && files[i].size == upload.files[i].size &&
           files[i].sha256.size() == 64;
  }
  if (!same) {
    throw ProtocolError("rank " + std::to_string(rank) + " uploaded other files than it announced");
  }
  // In object storage, one listing of the checkpoint's prefix gives every size.
  std::map<std::string, uint64_t> stored;
  const auto name = checkpoint_name(state_.next_index);
  if (objects_ != nullptr) {
    for (const auto& object : objects_->list(name + "/")) {
      stored[object.key.substr(name.size() + 1)] = object.size;
    }
  }
  for (const auto& file : files) {
    if (objects_ != nullptr) {
      auto size = stored.find(file.path);
      if (size == stored.end() || size->second != file.size) {
        throw IoError("rank " + std::to_string(rank) + "'s checkpoint file " + file.path +
                      " did not arrive whole in " + objects_->url(name));
      }
      continue;
    }
    auto path = staging_dir() / file.path;
    std::error_code ec;
    auto size = std::filesystem::file_size(path, ec);
    if (ec || size != file.size) {
      throw IoError("rank " + std::to_string(rank) + "'s checkpoint file " + file.path +
                    " did not arrive whole in " + staging_dir().string());
    }
  }
  upload.files = files;
  upload.finished = true;
}

// One rank's file must not be another rank's directory: "a" from rank 0 and
// "a/b" from rank 1 cannot both be merged into one checkpoint.
void CheckpointStore::check_no_file_dir_clash(int rank, const std::string& path) {
  if (auto dir = dirs_.find(path); dir != dirs_.end()) {
    throw UsageError("rank " + std::to_string(rank) + " reports a file " + path + " where rank " +
                     std::to_string(dir->second) +
                     "'s checkpoint has a directory of that name: give per-rank files distinct "
                     "names");
  }
  for (size_t slash = path.find('/'); slash != std::string::npos;
       slash = path.find('/', slash + 1)) {
    auto prefix = path.substr(0, slash);
    if (auto file = names_.find(prefix); file != names_.end()) {
      throw UsageError("rank " + std::to_string(file->second) + " reports a file " + prefix +
                       " where rank " + std::to_string(rank) +
                       "'s checkpoint has a directory of that name (" + path +
                       "): give per-rank files distinct names");
    }
    dirs_.emplace(prefix, rank);
  }
}

bool CheckpointStore::uploading() const {
  return std::any_of(uploads_.begin(), uploads_.end(),
                     [](const auto& upload) { return !upload.second.finished; });
}

CheckpointInfo CheckpointStore::commit(int64_t iteration, const nlohmann::json& metrics) {
  auto staging = staging_dir();
  const int64_t index = state_.next_index;
  auto name = checkpoint_name(index);
  // In object storage, once the manifest may be there the name is never
  // discarded: a failure after it leaves a committed checkpoint (which the next
  // run adopts, as a filesystem run adopts one renamed into place) or one the
  // stored state already names.
  bool manifest_sent = false;
  try {
    TRAINRUN_CHECK(!uploading(), "commit() while a rank is still uploading");
    run_directory::Manifest manifest{iteration, metrics, {}, {}};
    for (const auto& [rank, upload] : uploads_) {
      manifest.ranks.push_back(rank);
      for (const auto& file : upload.files) {
        manifest.files.push_back({file.path, file.size, file.sha256, rank});
      }
    }
    std::sort(manifest.files.begin(), manifest.files.end(),
              [](const auto& a, const auto& b) { return a.path < b.path; });
    crash_point("commit:staged");
    std::filesystem::path final_dir;
    std::error_code ec;
    if (objects_ != nullptr) {
      // Put last: a prefix without a manifest was never committed.
      manifest_sent = true;
      objects_->client().put(objects_->key(name + "/" + kManifestFile),
                             run_directory::manifest_text(manifest));
      crash_point("commit:manifest");
      final_dir = objects_->url(name);
    } else {
      // Written last: a directory without a manifest was never committed.
      run_directory::write_manifest(staging, manifest);
      crash_point("commit:manifest");
      final_dir = run_dir_ / name;
      std::filesystem::rename(staging, final_dir, ec);
      if (ec) throw IoError("cannot rename " + staging.string() + ": " + ec.message());
      fsync_path(run_dir_);
      crash_point("commit:renamed");
    }
    auto next = state_;
    next.checkpoints.push_back({name, final_dir, iteration, metrics});
    next.latest = name;
    next.next_index = state_.next_index + 1;
    auto keep = kept(next.checkpoints);
    auto is_kept = [&](const CheckpointInfo& c) {
      return std::find(keep.begin(), keep.end(), c.name) != keep.end();
    };
    std::vector<CheckpointInfo> dropped;
    std::vector<CheckpointInfo> kept_checkpoints;
    for (auto& c : next.checkpoints) (is_kept(c) ? kept_checkpoints : dropped).push_back(c);
    next.checkpoints = std::move(kept_checkpoints);
    run_directory::write_checkpoint_state(run_dir_, next);
    if (objects_ != nullptr) {
      try {
        objects_->push(run_dir_, run_directory::kCheckpointStateFile);
      } catch (...) {
        // The local copy says what the store does (as far as known).
        run_directory::write_checkpoint_state(run_dir_, state_);
        throw;
      }
    }
    locate(next);
    state_ = std::move(next);
    crash_point("commit:state");
    // Deleted only once the state that no longer names them is committed. In
    // object storage a deletion that fails is left to the next run's recovery:
    // the checkpoint is committed, and a prefix the state does not name is
    // nothing.
    for (const auto& c : dropped) {
      if (objects_ != nullptr) {
        try {
          objects_->discard(c.name + "/");
        } catch (const IoError&) {
        }
      } else {
        std::filesystem::remove_all(c.path, ec);
      }
    }
    crash_point("commit:deleted");
  } catch (...) {
    if (manifest_sent) {
      uploads_.clear();
      names_.clear();
      dirs_.clear();
      if (state_.next_index == index) ++state_.next_index;  // never staged under it again
    } else {
      abort_staging();
    }
    throw;
  }
  uploads_.clear();
  names_.clear();
  dirs_.clear();
  return *latest();
}

std::vector<std::string> CheckpointStore::kept(
    const std::vector<CheckpointInfo>& checkpoints) const {
  std::vector<std::string> names;
  for (const auto& c : checkpoints) names.push_back(c.name);
  if (config_.num_to_keep <= 0 || names.empty()) return names;
  auto ranked = checkpoints;
  std::stable_sort(ranked.begin(), ranked.end(), [&](const auto& a, const auto& b) {
    return run_directory::ranks_before(a, b, config_);
  });
  std::vector<std::string> keep;
  for (size_t i = 0; i < ranked.size() && i < static_cast<size_t>(config_.num_to_keep); ++i) {
    keep.push_back(ranked[i].name);
  }
  // The latest is always kept: a rerun resumes from it.
  if (std::find(keep.begin(), keep.end(), names.back()) == keep.end()) keep.push_back(names.back());
  return keep;
}

void CheckpointStore::abort_staging() {
  const bool staged = !uploads_.empty();
  uploads_.clear();  // closes any file being streamed
  names_.clear();
  dirs_.clear();
  if (objects_ != nullptr) {
    if (!staged) return;
    // A rank may still be putting parts: the name is not used again, and what
    // arrives late is deleted by the next run of this name.
    auto name = checkpoint_name(state_.next_index);
    ++state_.next_index;
    try {
      objects_->discard(name + "/");
    } catch (const IoError&) {  // the store is down: the next run deletes it
    }
    return;
  }
  std::error_code ec;
  std::filesystem::remove_all(staging_dir(), ec);
}

}  // namespace trainrun
