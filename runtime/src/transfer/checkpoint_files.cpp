#include "transfer/checkpoint_files.h"

#include <trainrun/error.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string_view>

#include "common/atomic_file.h"
#include "transfer/chunked_file.h"

namespace trainrun {
namespace {

// copy_and_hash works through a mapped source in pieces of this size. With
// 4 MiB pieces, two ranks' 512 MiB each commit in 0.65 s against cp -r and
// sync's 0.81 s on the same disk (1 MiB: 0.92 s; write() from the map instead
// of copy_file_range: 1.8 s; tools/bench/checkpoint_throughput.py).
constexpr size_t kCopyPiece = 4 << 20;

std::string errno_text() { return std::strerror(errno); }

}  // namespace

std::vector<protocol::CheckpointFile> list_checkpoint_files(const std::filesystem::path& dir,
                                                            int rank) {
  const auto who = "rank " + std::to_string(rank) + "'s checkpoint";
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) {
    throw UsageError(who + " directory " + dir.string() + " does not exist");
  }
  std::vector<protocol::CheckpointFile> files;
  for (auto it = std::filesystem::recursive_directory_iterator(dir, ec);
       it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
    if (ec) break;
    auto relative = it->path().lexically_relative(dir).generic_string();
    auto status = it->symlink_status();
    if (std::filesystem::is_symlink(status)) {
      throw UsageError(who + " holds a symbolic link, " + relative +
                       ": only regular files and directories are allowed");
    }
    if (std::filesystem::is_directory(status)) continue;
    if (!std::filesystem::is_regular_file(status)) {
      throw UsageError(who + " holds " + relative + ", which is not a regular file");
    }
    files.push_back({relative, it->file_size(ec), ""});
    if (ec) break;
  }
  if (ec) throw IoError("cannot list " + dir.string() + ": " + ec.message());
  std::sort(files.begin(), files.end(),
            [](const auto& a, const auto& b) { return a.path < b.path; });
  return files;
}

bool is_safe_checkpoint_path(const std::string& path) {
  if (path.empty() || path.front() == '/') return false;
  size_t start = 0;
  while (start <= path.size()) {
    size_t end = path.find('/', start);
    if (end == std::string::npos) end = path.size();
    std::string_view part(path.data() + start, end - start);
    if (part.empty() || part == "." || part == "..") return false;
    start = end + 1;
  }
  return path.find('\0') == std::string::npos;
}

std::string copy_and_hash(const std::filesystem::path& from, const std::filesystem::path& to) {
  Fd in(::open(from.c_str(), O_RDONLY | O_CLOEXEC));
  if (in.get() < 0)
    throw IoError("cannot read checkpoint file " + from.string() + ": " + errno_text());
  struct stat st {};
  if (::fstat(in.get(), &st) != 0)
    throw IoError("cannot stat " + from.string() + ": " + errno_text());
  const auto size = static_cast<uint64_t>(st.st_size);
  ChunkedFile out(to, size, ChunkedFile::Hashing::kSha256);
  if (size == 0) return out.finish();
  // Mapped, the bytes are hashed from the page cache without a copy into a
  // buffer, while the kernel copies them file to file, as cp does. The caller
  // must not change the file meanwhile (train::report blocks its owner until
  // the upload ends, or the directory was handed over); a copy that differs
  // from its hash fails verification.
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, in.get(), 0);
  if (map == MAP_FAILED) throw IoError("cannot map " + from.string() + ": " + errno_text());
  ::madvise(map, size, MADV_SEQUENTIAL);
  try {
    const auto* bytes = static_cast<const char*>(map);
    for (uint64_t offset = 0; offset < size; offset += kCopyPiece) {
      out.write_from(in.get(), offset, bytes + offset,
                     std::min<uint64_t>(kCopyPiece, size - offset));
    }
  } catch (...) {
    ::munmap(map, size);
    throw;
  }
  ::munmap(map, size);
  return out.finish();
}

}  // namespace trainrun
