#include "storage/checkpoint_store.h"

#include <trainrun/error.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <vector>

#include "common/atomic_file.h"
#include "common/hash.h"

namespace trainrun {
namespace {

constexpr const char* kStateFile = "checkpoint_state.json";
constexpr const char* kManifest = "manifest.json";
constexpr const char* kStagingPrefix = ".staging-";

std::string checkpoint_name(int64_t index) {
  char name[32];
  std::snprintf(name, sizeof(name), "checkpoint_%06lld", static_cast<long long>(index));
  return name;
}

}  // namespace

CheckpointStore::CheckpointStore(std::filesystem::path run_dir, CheckpointConfig config)
    : run_dir_(std::move(run_dir)), config_(std::move(config)) {
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(run_dir_, ec)) {
    if (entry.path().filename().string().rfind(kStagingPrefix, 0) == 0) {
      std::filesystem::remove_all(entry.path(), ec);  // a commit that never finished
    }
  }
  state_ = {{"checkpoints", nlohmann::json::array()}, {"latest", nullptr}, {"next_index", 0}};
  auto path = run_dir_ / kStateFile;
  if (!std::filesystem::exists(path)) return;
  std::ifstream in(path);
  auto loaded = nlohmann::json::parse(in, nullptr, false);
  if (loaded.is_discarded() || !loaded.is_object()) {
    throw IoError(path.string() + " is not valid JSON");
  }
  state_ = loaded;
  if (auto checkpoint = latest();
      checkpoint && !std::filesystem::exists(checkpoint->dir / kManifest)) {
    throw IoError(path.string() + " names checkpoint " + checkpoint->name +
                  ", which is missing or was never committed (no " + kManifest + ")");
  }
}

std::optional<CommittedCheckpoint> CheckpointStore::latest() const {
  if (!state_["latest"].is_string()) return std::nullopt;
  auto name = state_["latest"].get<std::string>();
  int64_t iteration = 0;
  for (const auto& c : state_["checkpoints"]) {
    if (c["name"] == name) iteration = c.value("iteration", int64_t{0});
  }
  return CommittedCheckpoint{name, run_dir_ / name, iteration};
}

std::filesystem::path CheckpointStore::staging_dir() const {
  return run_dir_ / (kStagingPrefix + checkpoint_name(state_["next_index"].get<int64_t>()));
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
    std::filesystem::create_directories(staging, ec);
    if (ec) throw IoError("cannot create " + staging.string() + ": " + ec.message());
    for (const auto& file : files) {
      if (!is_safe_checkpoint_path(file.path)) {
        throw UsageError("rank " + std::to_string(rank) + "'s checkpoint names an unsafe path, " +
                         file.path + ": only relative paths inside the checkpoint are allowed");
      }
      if (auto [found, inserted] = names_.emplace(file.path, rank); !inserted) {
        throw UsageError("ranks " + std::to_string(found->second) + " and " + std::to_string(rank) +
                         " both report a checkpoint file named " + file.path +
                         ": give per-rank files distinct names, e.g. model-rank=" +
                         std::to_string(rank) + ".pt");
      }
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

void CheckpointStore::write_chunk(int rank, uint32_t index, uint64_t offset, const void* data,
                                  size_t size) {
  auto found = uploads_.find(rank);
  if (found == uploads_.end() || found->second.finished || index >= found->second.files.size() ||
      index < found->second.streaming) {
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
  for (const auto& file : files) {
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

bool CheckpointStore::uploading() const {
  return std::any_of(uploads_.begin(), uploads_.end(),
                     [](const auto& upload) { return !upload.second.finished; });
}

CommittedCheckpoint CheckpointStore::commit(int64_t iteration, const nlohmann::json& metrics) {
  auto staging = staging_dir();
  auto name = checkpoint_name(state_["next_index"].get<int64_t>());
  try {
    TRAINRUN_CHECK(!uploading(), "commit() while a rank is still uploading");
    nlohmann::json files = nlohmann::json::array();
    std::vector<int> ranks;
    for (const auto& [rank, upload] : uploads_) {
      ranks.push_back(rank);
      for (const auto& file : upload.files) {
        files.push_back(
            {{"path", file.path}, {"size", file.size}, {"sha256", file.sha256}, {"rank", rank}});
      }
    }
    std::sort(files.begin(), files.end(),
              [](const auto& a, const auto& b) { return a["path"] < b["path"]; });
    nlohmann::json manifest = {
        {"iteration", iteration}, {"metrics", metrics}, {"ranks", ranks}, {"files", files}};
    // Written last: a directory without a manifest was never committed.
    write_file_atomic(staging / kManifest, manifest.dump(2) + "\n");
    auto final_dir = run_dir_ / name;
    std::error_code ec;
    std::filesystem::rename(staging, final_dir, ec);
    if (ec) throw IoError("cannot rename " + staging.string() + ": " + ec.message());
    fsync_path(run_dir_);
    auto next = state_;
    next["checkpoints"].push_back({{"name", name}, {"iteration", iteration}, {"metrics", metrics}});
    next["latest"] = name;
    next["next_index"] = state_["next_index"].get<int64_t>() + 1;
    auto keep = kept(next["checkpoints"]);
    auto before = next["checkpoints"];
    next["checkpoints"] = nlohmann::json::array();
    for (const auto& c : before) {
      if (std::find(keep.begin(), keep.end(), c["name"]) != keep.end()) {
        next["checkpoints"].push_back(c);
      }
    }
    write_file_atomic(run_dir_ / kStateFile, next.dump(2) + "\n");
    state_ = std::move(next);
    // Deleted only once the state that no longer names them is committed.
    for (const auto& c : before) {
      if (std::find(keep.begin(), keep.end(), c["name"]) == keep.end()) {
        std::filesystem::remove_all(run_dir_ / c["name"].get<std::string>(), ec);
      }
    }
  } catch (...) {
    abort_staging();
    throw;
  }
  uploads_.clear();
  names_.clear();
  return *latest();
}

std::vector<std::string> CheckpointStore::kept(const nlohmann::json& checkpoints) const {
  std::vector<std::string> names;
  for (const auto& c : checkpoints) names.push_back(c["name"]);
  if (config_.num_to_keep <= 0 || names.empty()) return names;
  std::vector<nlohmann::json> ranked(checkpoints.begin(), checkpoints.end());
  std::stable_sort(ranked.begin(), ranked.end(),
                   [&](const auto& a, const auto& b) { return ranks_before(a, b, config_); });
  std::vector<std::string> keep;
  for (size_t i = 0; i < ranked.size() && i < static_cast<size_t>(config_.num_to_keep); ++i) {
    keep.push_back(ranked[i]["name"]);
  }
  // The latest is always kept: a rerun resumes from it.
  if (std::find(keep.begin(), keep.end(), names.back()) == keep.end()) keep.push_back(names.back());
  return keep;
}

bool ranks_before(const nlohmann::json& a, const nlohmann::json& b,
                  const CheckpointConfig& config) {
  const auto& attribute = config.score_attribute;
  if (attribute.empty()) return a["iteration"] > b["iteration"];
  auto sa = a["metrics"].value(attribute, nlohmann::json());
  auto sb = b["metrics"].value(attribute, nlohmann::json());
  if (!sa.is_number() || !sb.is_number()) return sa.is_number() && !sb.is_number();
  return config.score_max ? sa.get<double>() > sb.get<double>()
                          : sa.get<double>() < sb.get<double>();
}

void CheckpointStore::abort_staging() {
  uploads_.clear();  // closes any file being streamed
  names_.clear();
  std::error_code ec;
  std::filesystem::remove_all(staging_dir(), ec);
}

std::vector<protocol::CheckpointFile> read_manifest_files(const std::filesystem::path& dir) {
  std::ifstream in(dir / kManifest);
  auto manifest = nlohmann::json::parse(in, nullptr, false);
  if (!in || !manifest.is_object() || !manifest.contains("files") ||
      !manifest["files"].is_array()) {
    throw IoError("checkpoint " + dir.string() + " has no readable " + kManifest);
  }
  std::vector<protocol::CheckpointFile> files;
  try {
    for (const auto& file : manifest["files"]) {
      files.push_back({file.at("path").get<std::string>(), file.at("size").get<uint64_t>(),
                       file.at("sha256").get<std::string>()});
    }
  } catch (const nlohmann::json::exception&) {
    throw IoError("checkpoint " + dir.string() + " has a malformed " + kManifest);
  }
  return files;
}

void verify_checkpoint(const std::filesystem::path& dir) {
  for (const auto& file : read_manifest_files(dir)) {
    auto path = dir / file.path;
    std::error_code ec;
    auto size = std::filesystem::file_size(path, ec);
    if (ec || size != file.size || sha256_file(path) != file.sha256) {
      throw IoError("checkpoint file " + path.string() +
                    " is missing or corrupt (its size or sha256 differs from the manifest)");
    }
  }
}

}  // namespace trainrun
