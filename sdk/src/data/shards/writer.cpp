// ShardWriter: numbered tar shards, each with its index, renamed into place
// once whole.

#include <train/shard_files.h>

#include "data/shards/tar.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <set>

namespace train {
namespace {

[[noreturn]] void fail_write(const std::string& path) {
  throw ShardError("cannot write " + path + ": " + std::strerror(errno));
}

void write_all(int fd, std::string_view bytes, const std::string& path) {
  while (!bytes.empty()) {
    const ssize_t n = ::write(fd, bytes.data(), bytes.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) fail_write(path);
    bytes.remove_prefix(static_cast<size_t>(n));
  }
}

// Writes `bytes` to `path` through a temporary file and a rename.
void write_file_atomically(const std::string& path, std::string_view bytes) {
  const std::string temporary = path + ".partial";
  const int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail_write(temporary);
  try {
    write_all(fd, bytes, temporary);
    if (::fsync(fd) != 0) fail_write(temporary);
  } catch (...) {
    ::close(fd);
    ::unlink(temporary.c_str());
    throw;
  }
  ::close(fd);
  if (::rename(temporary.c_str(), path.c_str()) != 0) fail_write(path);
}

// The one integer conversion of a shard pattern, checked.
void check_pattern(const std::string& pattern) {
  size_t conversions = 0;
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] != '%') continue;
    if (i + 1 < pattern.size() && pattern[i + 1] == '%') {
      ++i;
      continue;
    }
    size_t j = i + 1;
    while (j < pattern.size() && (pattern[j] == '0' || pattern[j] == '-')) ++j;
    while (j < pattern.size() && pattern[j] >= '0' && pattern[j] <= '9') ++j;
    if (j >= pattern.size() || (pattern[j] != 'd' && pattern[j] != 'u') || j - i > 4) {
      throw std::invalid_argument("ShardWriter: '" + pattern +
                                  "' has a conversion other than an integer's (%06d)");
    }
    ++conversions;
    i = j;
  }
  if (conversions != 1) {
    throw std::invalid_argument("ShardWriter: '" + pattern +
                                "' needs one integer conversion for the shard's number (%06d)");
  }
}

void check_key(const std::string& key) {
  const auto base = key.rfind('/') == std::string::npos ? 0 : key.rfind('/') + 1;
  if (key.empty() || base == key.size() || key.find('.', base) != std::string::npos ||
      key[0] == '/' || key.find('\0') != std::string::npos ||
      (key.size() >= 4 && key.compare(0, 2, "__") == 0 && key.compare(key.size() - 2, 2, "__") == 0)) {
    throw std::invalid_argument("ShardWriter: '" + key +
                                "' is not a sample key (a relative path with no dot in its last "
                                "part)");
  }
}

}  // namespace

struct ShardWriter::Open {
  std::string path;
  int fd = -1;
  uint64_t bytes = 0;
  ShardIndex index;
  std::string last_key;  // a sample's members must not follow its own
};

ShardWriter::ShardWriter(std::string pattern, ShardWriterOptions options)
    : pattern_(std::move(pattern)), options_(options) {
  check_pattern(pattern_);
  if (options_.max_bytes == 0) {
    throw std::invalid_argument("ShardWriter: max_bytes must be at least 1");
  }
}

ShardWriter::~ShardWriter() {
  try {
    finish();
  } catch (...) {  // close() reports them
  }
}

void ShardWriter::write(const std::string& key,
                        const std::vector<std::pair<std::string, std::string>>& fields) {
  check_key(key);
  if (fields.empty()) throw std::invalid_argument("ShardWriter: sample " + key + " has no field");
  if (open_ && key == open_->last_key) {
    // Readers would take both for one sample.
    throw std::invalid_argument("ShardWriter: sample " + key + " follows a sample of the same key");
  }
  std::set<std::string> names;
  std::string members;
  for (const auto& [name, bytes] : fields) {
    if (name.empty() || name.find('/') != std::string::npos || name.find('\0') != std::string::npos ||
        name.front() == '.' || name.back() == '.' ||
        std::any_of(name.begin(), name.end(), [](unsigned char c) { return std::isupper(c); })) {
      throw std::invalid_argument("ShardWriter: sample " + key + ": '" + name +
                                  "' is not a field name (a lowercase extension such as jpg)");
    }
    if (!names.insert(name).second) {
      throw std::invalid_argument("ShardWriter: sample " + key + " has field '" + name + "' twice");
    }
    members += shards::file_header(key + "." + name, bytes.size());
    members += bytes;
    members.resize(members.size() + shards::padded(bytes.size()) - bytes.size(), '\0');
  }
  if (open_ && !open_->index.samples.empty() &&
      ((options_.max_samples > 0 && open_->index.samples.size() >= options_.max_samples) ||
       open_->bytes + members.size() > options_.max_bytes)) {
    finish();
  }
  if (!open_) {
    const int needed = std::snprintf(nullptr, 0, pattern_.c_str(), static_cast<int>(written_.size()));
    std::string path(static_cast<size_t>(std::max(needed, 0)), '\0');
    std::snprintf(path.data(), path.size() + 1, pattern_.c_str(), static_cast<int>(written_.size()));
    auto open = std::make_unique<Open>();
    open->path = std::move(path);
    const std::string temporary = open->path + ".partial";
    open->fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (open->fd < 0) fail_write(temporary);
    open_ = std::move(open);
  }
  try {
    write_all(open_->fd, members, open_->path + ".partial");
  } catch (...) {  // a torn member: the shard is dropped, never finished
    ::close(open_->fd);
    ::unlink((open_->path + ".partial").c_str());
    open_.reset();
    throw;
  }
  open_->index.samples.emplace_back(open_->bytes, members.size());
  open_->bytes += members.size();
  open_->last_key = key;
}

void ShardWriter::finish() {
  if (!open_) return;
  auto open = std::move(open_);
  const std::string temporary = open->path + ".partial";
  try {
    write_all(open->fd, shards::end_of_archive(), temporary);
    if (::fsync(open->fd) != 0) fail_write(temporary);
  } catch (...) {
    ::close(open->fd);
    ::unlink(temporary.c_str());
    throw;
  }
  ::close(open->fd);
  open->index.shard_bytes = open->bytes + 2 * shards::kTarBlock;
  write_file_atomically(index_path(open->path), open->index.serialize());
  if (::rename(temporary.c_str(), open->path.c_str()) != 0) fail_write(open->path);
  written_.push_back(open->path);
}

std::vector<std::string> ShardWriter::close() {
  finish();
  return written_;
}

}  // namespace train
