#include "worker/checkpoint_handover.h"

#include <trainrun/error.h>

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>

#include "common/network.h"

namespace trainrun {
namespace {

// Every directory handed over and not yet deleted, for the process's way out.
std::mutex handed_over_mutex;
const std::string kHandedOverTag = ".trainrun-upload-";
std::set<std::filesystem::path>& handed_over() {
  static auto* dirs = new std::set<std::filesystem::path>;  // never destroyed: _Exit skips it
  return *dirs;
}

void forget(const std::filesystem::path& dir) {
  std::lock_guard<std::mutex> lock(handed_over_mutex);
  handed_over().erase(dir);
}

// Deletes what workers of this host that are gone (killed while uploading)
// handed over in `parent`: <name>.trainrun-upload-<host>-<pid>-<iteration>.
void remove_abandoned(const std::filesystem::path& parent, const std::string& host) {
  const auto tag = kHandedOverTag + host + "-";
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(parent, ec)) {
    auto name = entry.path().filename().string();
    auto at = name.rfind(tag);
    if (at == std::string::npos) continue;
    auto rest = name.substr(at + tag.size());  // <pid>-<iteration>
    auto dash = rest.find('-');
    if (dash == std::string::npos || dash == 0 ||
        rest.find_first_not_of("0123456789-") != std::string::npos) {
      continue;
    }
    auto pid = std::strtol(rest.substr(0, dash).c_str(), nullptr, 10);
    if (pid <= 0 || pid == ::getpid() || ::kill(static_cast<pid_t>(pid), 0) == 0 ||
        errno != ESRCH) {
      continue;
    }
    std::filesystem::remove_all(entry.path(), ec);
  }
}

// Whether `path` is `dir` or lies inside it (both absolute and normal).
bool is_within(const std::filesystem::path& path, const std::filesystem::path& dir) {
  auto relative = path.lexically_relative(dir);
  return !relative.empty() && *relative.begin() != "..";
}

}  // namespace

std::filesystem::path hand_over_checkpoint(const std::filesystem::path& dir, int64_t iteration,
                                           const std::vector<KeptDirectory>& kept) {
  const std::string refused = "cannot hand checkpoint directory " + dir.string() + " over";
  // "a/b/", "a/b/." and "a/b" alike name b itself, never what a link b points at.
  auto path = std::filesystem::absolute(dir).lexically_normal();
  if (!path.has_filename()) path = path.parent_path();
  std::error_code ec;
  auto status = std::filesystem::symlink_status(path, ec);
  if (std::filesystem::is_symlink(status)) {
    throw UsageError(refused + ": it is a symbolic link; pass the directory itself");
  }
  if (!std::filesystem::is_directory(status)) {
    throw UsageError(refused + ": it is not a directory");
  }
  if (path == path.root_path()) throw UsageError(refused + ": it is the root directory");
  path = std::filesystem::weakly_canonical(path.parent_path(), ec) / path.filename();
  if (ec) throw UsageError(refused + ": " + ec.message());
  auto check = [&](const std::filesystem::path& other, const std::string& what, bool inside_too) {
    if (is_within(other, path) || (inside_too && is_within(path, other))) {
      throw UsageError(refused + ": it " + (is_within(other, path) ? "holds" : "lies inside") +
                       " " + what + " (" + other.string() +
                       "); asynchronous upload moves and deletes the directory it is given, so "
                       "pass one of the train function's own, or use CheckpointUploadMode::kSync");
    }
  };
  for (const auto& keep : kept) {
    if (keep.path.empty()) continue;
    auto other = std::filesystem::weakly_canonical(keep.path, ec);
    if (!ec) check(other, keep.what, keep.inside_too);
  }
  const auto host = host_name();
  const auto prefix = path.filename().string() + kHandedOverTag + host + "-";
  auto target =
      path.parent_path() / (prefix + std::to_string(::getpid()) + "-" + std::to_string(iteration));
  std::lock_guard<std::mutex> lock(handed_over_mutex);
  for (const auto& uploading : handed_over()) check(uploading, "a checkpoint being uploaded", true);
  remove_abandoned(path.parent_path(), host);
  std::filesystem::remove_all(target, ec);  // an earlier process's, of the same pid
  if (::rename(path.c_str(), target.c_str()) != 0) {
    throw UsageError(refused + ": cannot move it to " + target.string() + ": " +
                     std::strerror(errno) +
                     " (asynchronous upload needs a directory whose parent it may write)");
  }
  handed_over().insert(target);
  return target;
}

void remove_handed_over_checkpoint(const std::filesystem::path& dir) {
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  forget(dir);
}

void give_back_checkpoint(const std::filesystem::path& handed_over,
                          const std::filesystem::path& dir) {
  std::lock_guard<std::mutex> lock(handed_over_mutex);
  if (::rename(handed_over.c_str(), std::filesystem::absolute(dir).c_str()) == 0) {
    trainrun::handed_over().erase(handed_over);
  }
}

void remove_handed_over_checkpoints() {
  std::lock_guard<std::mutex> lock(handed_over_mutex);
  for (const auto& dir : handed_over()) {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
  handed_over().clear();
}

}  // namespace trainrun
