#include "storage/checkpoint_store.h"

#include <trainrun/error.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <string_view>
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

// Copies one regular file and hashes it in the same pass (the bytes are read
// once), then fsyncs the copy. Returns its size and sha256.
std::pair<uint64_t, std::string> copy_and_hash(const std::filesystem::path& from,
                                               const std::filesystem::path& to) {
  int in = ::open(from.c_str(), O_RDONLY | O_CLOEXEC);
  if (in < 0) {
    throw IoError("cannot read checkpoint file " + from.string() + ": " + std::strerror(errno));
  }
  int out = ::open(to.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (out < 0) {
    int saved = errno;
    ::close(in);
    throw IoError("cannot create " + to.string() + ": " + std::strerror(saved));
  }
  Sha256 hash;
  uint64_t size = 0;
  std::vector<char> buffer(4 << 20);
  bool ok = true;
  while (ok) {
    ssize_t n = ::read(in, buffer.data(), buffer.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      ok = n == 0;
      break;
    }
    hash.update(buffer.data(), static_cast<size_t>(n));
    ok = write_all(out, std::string_view(buffer.data(), static_cast<size_t>(n)));
    size += static_cast<uint64_t>(n);
  }
  ok = ok && ::fsync(out) == 0;
  int saved = errno;
  ::close(in);
  ::close(out);
  if (!ok) throw IoError("cannot write " + to.string() + ": " + std::strerror(saved));
  return {size, hash.hex_digest()};
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

void CheckpointStore::stage(int rank, const std::filesystem::path& source) {
  try {
    start_copy(rank, source);
  } catch (...) {
    abort_staging();  // this checkpoint cannot be committed: drop every rank's part
    throw;
  }
}

void CheckpointStore::start_copy(int rank, const std::filesystem::path& source) {
  std::error_code ec;
  if (!std::filesystem::is_directory(source, ec)) {
    throw UsageError("rank " + std::to_string(rank) + "'s checkpoint directory " + source.string() +
                     " does not exist");
  }
  auto staging = staging_dir();
  std::filesystem::create_directories(staging, ec);
  if (ec) throw IoError("cannot create " + staging.string() + ": " + ec.message());
  std::vector<std::pair<std::filesystem::path, std::string>> files;  // source, relative
  for (auto it = std::filesystem::recursive_directory_iterator(source, ec);
       it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
    if (ec) throw IoError("cannot list " + source.string() + ": " + ec.message());
    const auto& entry = *it;
    auto relative = entry.path().lexically_relative(source).generic_string();
    auto status = entry.symlink_status();
    if (std::filesystem::is_symlink(status)) {
      throw UsageError("rank " + std::to_string(rank) + "'s checkpoint holds a symbolic link, " +
                       relative + ": only regular files and directories are allowed");
    }
    if (std::filesystem::is_directory(status)) {
      std::filesystem::create_directories(staging / relative, ec);
      continue;
    }
    if (!std::filesystem::is_regular_file(status)) {
      throw UsageError("rank " + std::to_string(rank) + "'s checkpoint holds " + relative +
                       ", which is not a regular file");
    }
    if (auto [found, inserted] = staged_.emplace(relative, rank); !inserted) {
      throw UsageError(
          "ranks " + std::to_string(found->second) + " and " + std::to_string(rank) +
          " both report a checkpoint file named " + relative +
          ": give per-rank files distinct names, e.g. model-rank=" + std::to_string(rank) + ".pt");
    }
    files.emplace_back(entry.path(), relative);
  }
  copies_.push_back(std::async(std::launch::async, [files, staging, rank] {
    std::vector<StagedFile> staged;
    for (const auto& [from, relative] : files) {
      auto [size, sha256] = copy_and_hash(from, staging / relative);
      staged.push_back({relative, rank, size, sha256});
    }
    return staged;
  }));
}

CommittedCheckpoint CheckpointStore::commit(int64_t iteration, const nlohmann::json& metrics) {
  auto staging = staging_dir();
  auto name = checkpoint_name(state_["next_index"].get<int64_t>());
  try {
    std::vector<StagedFile> staged;
    for (auto& copy : copies_) {
      auto rank_files = copy.get();  // rethrows a failed copy
      staged.insert(staged.end(), rank_files.begin(), rank_files.end());
    }
    copies_.clear();
    std::sort(staged.begin(), staged.end(),
              [](const auto& a, const auto& b) { return a.relative < b.relative; });
    nlohmann::json files = nlohmann::json::array();
    std::vector<int> ranks;
    for (const auto& file : staged) {
      files.push_back({{"path", file.relative},
                       {"size", file.size},
                       {"sha256", file.sha256},
                       {"rank", file.rank}});
      if (std::find(ranks.begin(), ranks.end(), file.rank) == ranks.end())
        ranks.push_back(file.rank);
    }
    std::sort(ranks.begin(), ranks.end());
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
  staged_.clear();
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
  for (auto& copy : copies_) {
    try {
      copy.get();  // wait: nothing may still be writing into the directory
    } catch (const std::exception&) {
    }
  }
  copies_.clear();
  std::error_code ec;
  std::filesystem::remove_all(staging_dir(), ec);
  staged_.clear();
}

void verify_checkpoint(const std::filesystem::path& dir) {
  auto manifest_path = dir / kManifest;
  std::ifstream in(manifest_path);
  auto manifest = nlohmann::json::parse(in, nullptr, false);
  if (!in || manifest.is_discarded() || !manifest.contains("files")) {
    throw IoError("checkpoint " + dir.string() + " has no readable " + kManifest);
  }
  for (const auto& file : manifest["files"]) {
    auto path = dir / file["path"].get<std::string>();
    std::error_code ec;
    auto size = std::filesystem::file_size(path, ec);
    if (ec || size != file["size"].get<uint64_t>() || sha256_file(path) != file["sha256"]) {
      throw IoError("checkpoint file " + path.string() +
                    " is missing or corrupt (its size or sha256 differs from the manifest)");
    }
  }
}

}  // namespace trainrun
