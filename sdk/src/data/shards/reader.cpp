// ShardReader: local shards opened with their indexes, samples read by range.

#include <train/shard_files.h>

#include "data/sources/file.h"

#include <algorithm>
#include <optional>
#include <fstream>
#include <sstream>

#include <fcntl.h>
#include <unistd.h>

namespace train {
namespace {

// The index file's bytes, or none when there is no index file.
std::optional<std::string> read_index_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::ostringstream bytes;
  bytes << in.rdbuf();
  if (in.bad()) throw ShardError("cannot read shard index " + path);
  return bytes.str();
}

// Writes an index beside its shard, where the directory allows; a read-only
// dataset is indexed again on its next use instead.
void try_write_index(const std::string& path, const std::string& bytes) {
  const std::string temporary = path + ".partial." + std::to_string(::getpid());
  const int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return;
  const bool written = ::write(fd, bytes.data(), bytes.size()) == static_cast<ssize_t>(bytes.size());
  ::close(fd);
  if (!written || ::rename(temporary.c_str(), path.c_str()) != 0) ::unlink(temporary.c_str());
}

}  // namespace

struct ShardReader::Shard {
  explicit Shard(const std::string& path) : file(path) {}
  sources::LocalFile file;
  ShardIndex index;
};

ShardReader::ShardReader(const std::string& spec) {
  std::vector<std::string> paths;
  try {
    paths = expand_shards(spec);
  } catch (const std::invalid_argument& error) {
    throw ShardError(error.what());
  }
  for (auto& path : paths) {
    if (path.rfind("s3://", 0) == 0) {
      throw ShardError("shard " + path + ": s3:// shards are read through the run's storage, "
                       "which this reader does not reach (give local paths)");
    }
    auto shard = std::make_unique<Shard>(path);
    const auto index_file = index_path(path);
    if (auto bytes = read_index_file(index_file)) {
      shard->index = ShardIndex::parse(*bytes, index_file);
      if (shard->index.shard_bytes != shard->file.size()) {
        throw ShardError("shard index " + index_file + " describes a shard of " +
                         std::to_string(shard->index.shard_bytes) + " bytes, but " + path +
                         " has " + std::to_string(shard->file.size()) +
                         ": it is stale (index the shard again: trainrun index " + path + ")");
      }
    } else {
      const auto mapping = shard->file.map();
      shard->index = index_shard(mapping.bytes(), "shard " + path);
      try_write_index(index_file, shard->index.serialize());
    }
    starts_.push_back(size_);
    counts_.push_back(shard->index.samples.size());
    size_ += shard->index.samples.size();
    paths_.push_back(std::move(path));
    shards_.push_back(std::move(shard));
  }
}

ShardReader::~ShardReader() = default;
ShardReader::ShardReader(ShardReader&&) noexcept = default;
ShardReader& ShardReader::operator=(ShardReader&&) noexcept = default;

const std::vector<std::string>& ShardReader::shards() const { return paths_; }
const std::vector<uint64_t>& ShardReader::counts() const { return counts_; }

std::pair<size_t, uint64_t> ShardReader::locate(uint64_t index) const {
  if (index >= size_) {
    throw std::out_of_range("sample " + std::to_string(index) + " is past the " +
                            std::to_string(size_) + " samples of the shards");
  }
  const auto shard = static_cast<size_t>(
      std::upper_bound(starts_.begin(), starts_.end(), index) - starts_.begin() - 1);
  return {shard, index - starts_[shard]};
}

Sample ShardReader::read(uint64_t index) const {
  const auto [shard, local] = locate(index);
  const auto& [offset, length] = shards_[shard]->index.samples[local];
  const std::string where = "shard " + paths_[shard] + ", sample " + std::to_string(local);
  std::string bytes;
  try {
    bytes = shards_[shard]->file.read(offset, length);
  } catch (const ShardError& error) {
    throw ShardError(where + ": " + error.what());
  }
  return parse_sample(bytes, where);
}

}  // namespace train
