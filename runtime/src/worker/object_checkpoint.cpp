#include "worker/object_checkpoint.h"

#include <trainrun/error.h>

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>

#include "common/atomic_file.h"
#include "common/hash.h"
#include "storage/run_directory.h"
#include "storage/s3_transfer.h"
#include "transfer/checkpoint_files.h"

namespace trainrun {
namespace {

constexpr const char* kComplete = ".complete";

Fd open_lock(const std::filesystem::path& path) {
  Fd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
  if (fd.get() < 0) throw IoError("cannot open " + path.string() + ": " + std::strerror(errno));
  return fd;
}

void lock(const Fd& fd, int operation, const std::filesystem::path& path) {
  while (::flock(fd.get(), operation) != 0) {
    if (errno != EINTR) throw IoError("cannot lock " + path.string() + ": " + std::strerror(errno));
  }
}

// Deletes the other downloaded checkpoints that no process uses or downloads.
// The lock files stay: one that a waiting process opened must stay the one
// every process locks.
void remove_unused(const std::filesystem::path& root, const std::string& keep) {
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(root, ec)) {
    auto path = entry.path();
    if (path.extension() != ".use" || path.stem() == keep) continue;
    Fd use(::open(path.c_str(), O_RDWR | O_CLOEXEC));
    if (use.get() < 0 || ::flock(use.get(), LOCK_EX | LOCK_NB) != 0) continue;
    auto download_path = root / (path.stem().string() + ".lock");
    Fd download(::open(download_path.c_str(), O_RDWR | O_CLOEXEC));
    if (download.get() < 0 || ::flock(download.get(), LOCK_EX | LOCK_NB) != 0) continue;
    std::filesystem::remove_all(root / path.stem(), ec);
  }
}

// This boot of the host: /proc's boot_id, empty where there is none.
std::string boot_id() {
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string id;
  std::getline(in, id);
  return id;
}

std::string read_text(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::string text;
  std::getline(in, text);
  return text;
}

}  // namespace

ObjectCheckpoint::ObjectCheckpoint(const std::string& url, const std::filesystem::path& cache_dir) {
  auto location = s3::parse_url(url);
  auto config = s3::resolve_config();
  s3::Client client(config, location.bucket);
  auto manifest_key = location.key(run_directory::kManifestFile);
  auto text = client.get(manifest_key);
  if (!text) throw IoError("checkpoint " + url + " has no " + run_directory::kManifestFile);
  auto manifest = run_directory::parse_manifest(*text, url);
  for (const auto& file : manifest.files) {
    if (!is_safe_checkpoint_path(file.path) || file.path == run_directory::kManifestFile) {
      throw UsageError("checkpoint " + url + " names an unsafe path, " + file.path);
    }
  }
  // The same checkpoint, byte for byte, has the same directory.
  Sha256 digest;
  std::string identity = url + "\n" + *text;
  digest.update(identity.data(), identity.size());
  auto root = cache_dir / "checkpoints";
  std::error_code ec;
  std::filesystem::create_directories(root, ec);
  if (ec) throw IoError("cannot create " + root.string() + ": " + ec.message());
  auto name = digest.hex_digest().substr(0, 32);
  dir_ = root / name;
  // In use (shared) for as long as this process lives; downloaded by the
  // first to take the download lock, which the others wait for.
  auto use_path = root / (name + ".use");
  in_use_ = open_lock(use_path);
  lock(in_use_, LOCK_SH, use_path);
  auto download_path = root / (name + ".lock");
  Fd download = open_lock(download_path);
  lock(download, LOCK_EX, download_path);
  // A copy completed since the host booted is whole; one from before a reboot
  // is checked again (its files were not fsynced), then trusted anew.
  const std::string boot = boot_id();
  bool whole = read_text(dir_ / kComplete) == boot && !boot.empty();
  if (!whole && std::filesystem::exists(dir_ / kComplete)) {
    whole = std::all_of(manifest.files.begin(), manifest.files.end(), [&](const auto& file) {
      std::error_code size_ec;
      return std::filesystem::file_size(dir_ / file.path, size_ec) == file.size && !size_ec &&
             sha256_file(dir_ / file.path) == file.sha256;
    });
    if (whole) write_file_atomic(dir_ / kComplete, boot);
  }
  if (!whole) {
    auto started = std::chrono::steady_clock::now();
    std::filesystem::remove_all(dir_, ec);
    std::filesystem::create_directories(dir_, ec);
    if (ec) throw IoError("cannot create " + dir_.string() + ": " + ec.message());
    std::vector<s3::Download> downloads;
    for (const auto& file : manifest.files) {
      auto path = dir_ / file.path;
      std::filesystem::create_directories(path.parent_path(), ec);
      if (ec) throw IoError("cannot create " + path.parent_path().string() + ": " + ec.message());
      downloads.push_back({location.key(file.path), file.size, path});
    }
    auto digests = s3::download_files(config, location.bucket, downloads,
                                      s3::TransferOptions::from_environment());
    for (size_t i = 0; i < digests.size(); ++i) {
      if (digests[i] != manifest.files[i].sha256) {
        throw IoError("checkpoint file " + manifest.files[i].path + " of " + url +
                      " arrived corrupt (its sha256 differs from the manifest)");
      }
    }
    // Read-only: the ranks of this host share the copy.
    for (const auto& file : manifest.files) {
      std::filesystem::permissions(dir_ / file.path,
                                   std::filesystem::perms::owner_read |
                                       std::filesystem::perms::group_read |
                                       std::filesystem::perms::others_read,
                                   ec);
    }
    write_file_atomic(dir_ / run_directory::kManifestFile, *text);
    write_file_atomic(dir_ / kComplete, boot);
    uint64_t bytes = 0;
    for (const auto& file : manifest.files) bytes += file.size;
    double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    // One line per host and checkpoint: the other local ranks use this copy.
    std::fprintf(stderr, "trainrun: downloaded %s for this host: %.1f MiB in %.2f s\n", url.c_str(),
                 static_cast<double>(bytes) / (1 << 20), seconds);
  }
  download.reset();
  remove_unused(root, name);
}

}  // namespace trainrun
