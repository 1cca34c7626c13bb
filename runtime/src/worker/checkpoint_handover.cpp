#include "worker/checkpoint_handover.h"

#include <trainrun/error.h>

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>
#include <utility>

#include "common/fd.h"
#include "common/network.h"

namespace trainrun {
namespace {

namespace fs = std::filesystem;

const std::string kHandedOverTag = ".trainrun-upload-";
const std::string kLockSuffix = ".lock";
// What makes `dir` a run's directory (its records) or a committed checkpoint
// (checkpoint_NNNNNN with its manifest), of this run or any other: the file
// that says so, or nothing. Names alone are not enough: a project may well
// have a run.json or a manifest.json of its own.
std::string record_in(const fs::path& dir) {
  std::error_code ec;
  auto has = [&](const char* name) { return fs::exists(dir / name, ec); };
  if (has("checkpoint_state.json")) return "checkpoint_state.json";
  if (has("run.json") && has("result.jsonl")) return "run.json";
  const auto name = dir.filename().string();
  if (name.rfind("checkpoint_", 0) == 0 && name.size() > 11 &&
      name.find_first_not_of("0123456789", 11) == std::string::npos && has("manifest.json")) {
    return "manifest.json";
  }
  return "";
}

// Every directory handed over and not yet deleted, with the descriptor of its
// held lock file, for the process's way out.
std::mutex handed_over_mutex;
std::map<fs::path, Fd>& handed_over() {
  static auto* dirs = new std::map<fs::path, Fd>;  // never destroyed: _Exit skips it
  return *dirs;
}

fs::path lock_path(const fs::path& dir) { return dir.string() + kLockSuffix; }

// Creates and locks `path`: while the lock is held, the directory beside it
// is in use. None when it cannot.
Fd take_lock(const fs::path& path) {
  for (int attempt = 0; attempt < 3; ++attempt) {
    Fd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
    if (!fd) return Fd();
    struct stat st {};
    // A sweeper may have unlinked the file between the open and the lock.
    if (::flock(fd.get(), LOCK_EX | LOCK_NB) == 0 && ::fstat(fd.get(), &st) == 0 &&
        st.st_nlink > 0) {
      return fd;
    }
  }
  return Fd();
}

// Unlocks and removes a directory's lock file (after the directory).
void release_lock(const fs::path& dir, Fd& lock_file) {
  ::unlink(lock_path(dir).c_str());
  lock_file.reset();
}

// Deletes what processes that are gone handed over in `parent`: a
// <dir>.lock beside <dir> that nobody holds (the kernel drops a flock with
// its process, however it ended; a live one, on this host or another, or in
// another container, holds its own).
void remove_abandoned(const fs::path& parent) {
  std::error_code ec;
  fs::directory_iterator it(parent, ec);
  for (const fs::directory_iterator end; !ec && it != end; it.increment(ec)) {
    const auto name = it->path().filename().string();
    if (name.find(kHandedOverTag) == std::string::npos || name.size() <= kLockSuffix.size() ||
        name.compare(name.size() - kLockSuffix.size(), kLockSuffix.size(), kLockSuffix) != 0) {
      continue;
    }
    Fd fd(::open(it->path().c_str(), O_RDWR | O_CLOEXEC));
    if (!fd) continue;
    if (::flock(fd.get(), LOCK_EX | LOCK_NB) == 0) {
      std::error_code removed;
      fs::remove_all(parent / name.substr(0, name.size() - kLockSuffix.size()), removed);
      ::unlink(it->path().c_str());
    }
  }
}

// Whether `path` is `dir` or lies inside it (both absolute and normal).
bool is_within(const fs::path& path, const fs::path& dir) {
  auto relative = path.lexically_relative(dir);
  return !relative.empty() && *relative.begin() != "..";
}

}  // namespace

HandedOver hand_over_checkpoint(const fs::path& dir, int64_t iteration,
                                const std::vector<KeptDirectory>& kept) {
  const std::string refused = "cannot hand checkpoint directory " + dir.string() + " over";
  // "a/b/", "a/b/." and "a/b" alike name b itself, never what a link b points at.
  auto path = fs::absolute(dir).lexically_normal();
  if (!path.has_filename()) path = path.parent_path();
  std::error_code ec;
  auto status = fs::symlink_status(path, ec);
  if (fs::is_symlink(status)) {
    throw UsageError(refused + ": it is a symbolic link; pass the directory itself");
  }
  if (!fs::is_directory(status)) throw UsageError(refused + ": it is not a directory");
  if (path == path.root_path()) throw UsageError(refused + ": it is the root directory");
  path = fs::weakly_canonical(path.parent_path(), ec) / path.filename();
  if (ec) throw UsageError(refused + ": " + ec.message());
  const std::string advice =
      "; asynchronous upload moves and deletes the directory it is given, so pass one of the "
      "train function's own, or use CheckpointUploadMode::kSync";
  auto check = [&](const fs::path& other, const std::string& what, bool inside_too) {
    if (is_within(other, path) || (inside_too && is_within(path, other))) {
      throw UsageError(refused + ": it " + (is_within(other, path) ? "holds" : "lies inside") +
                       " " + what + " (" + other.string() + ")" + advice);
    }
  };
  for (const auto& keep : kept) {
    if (keep.path.empty()) continue;
    auto other = fs::weakly_canonical(keep.path, ec);
    if (!ec) check(other, keep.what, keep.inside_too);
  }
  // A run's directory or a committed checkpoint, of any run, or anything in one.
  for (auto at = path; at.has_relative_path(); at = at.parent_path()) {
    if (auto record = record_in(at); !record.empty()) {
      throw UsageError(refused + ": " + (at == path ? "it is" : "it lies inside") +
                       " a run directory or a checkpoint (" + at.string() + " holds " + record +
                       ")" + advice);
    }
  }
  remove_abandoned(path.parent_path());
  const auto target =
      path.parent_path() / (path.filename().string() + kHandedOverTag + host_name() + "-" +
                            std::to_string(::getpid()) + "-" + std::to_string(iteration));
  std::lock_guard<std::mutex> lock(handed_over_mutex);
  for (const auto& uploading : handed_over()) {
    check(uploading.first, "a checkpoint being uploaded", true);
  }
  Fd lock_file = take_lock(lock_path(target));
  if (!lock_file) {
    throw UsageError(refused + ": cannot create " + lock_path(target).string() + ": " +
                     std::strerror(errno) +
                     " (asynchronous upload needs a directory whose parent it may write)");
  }
  if (::rename(path.c_str(), target.c_str()) != 0) {
    const int error = errno;
    release_lock(target, lock_file);
    throw UsageError(refused + ": cannot move it to " + target.string() + ": " +
                     std::strerror(error) +
                     " (asynchronous upload needs a directory whose parent it may write)");
  }
  handed_over()[target] = std::move(lock_file);
  return {target, path};
}

void remove_handed_over_checkpoint(const fs::path& dir) {
  std::error_code ec;
  fs::remove_all(dir, ec);
  std::lock_guard<std::mutex> lock(handed_over_mutex);
  auto found = handed_over().find(dir);
  if (found == handed_over().end()) return;
  release_lock(dir, found->second);
  handed_over().erase(found);
}

bool give_back_checkpoint(const HandedOver& handed) {
  std::lock_guard<std::mutex> lock(handed_over_mutex);
  auto found = handed_over().find(handed.dir);
  if (found == handed_over().end()) return false;
  const bool back = ::rename(handed.dir.c_str(), handed.source.c_str()) == 0;
  // Either way it is no longer this process's to delete.
  release_lock(handed.dir, found->second);
  handed_over().erase(found);
  return back;
}

void remove_handed_over_checkpoints() {
  std::lock_guard<std::mutex> lock(handed_over_mutex);
  for (auto& [dir, lock_file] : handed_over()) {
    std::error_code ec;
    fs::remove_all(dir, ec);
    release_lock(dir, lock_file);
  }
  handed_over().clear();
}

}  // namespace trainrun
