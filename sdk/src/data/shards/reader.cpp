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

constexpr uint64_t kMaxSampleBytes = uint64_t{1} << 30;  // one allocation per sample read

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
  std::unique_ptr<ShardSource> source;
  ShardIndex index;
};

namespace {

// A local shard, indexed when it has no index yet.
std::unique_ptr<ShardReader::Shard> open_local(const std::string& path) {
  auto file = std::make_unique<sources::LocalFile>(path);
  ShardIndex index;
  const auto index_file = index_path(path);
  if (auto bytes = read_index_file(index_file)) {
    index = ShardIndex::parse(*bytes, index_file);
  } else {
    index = index_local_shard(path);
    try_write_index(index_file, index.serialize());
  }
  auto shard = std::make_unique<ShardReader::Shard>();
  shard->source = std::move(file);
  shard->index = std::move(index);
  return shard;
}

// A shard in object storage, with its index object.
std::unique_ptr<ShardReader::Shard> open_remote(const std::string& url, const ShardOpener& opener) {
  if (!opener) {
    throw ShardError("shard " + url +
                     ": object storage is read inside a train function that trainrun started");
  }
  auto source = opener(url);
  if (!source) throw ShardError("shard " + url + ": no such object");
  const auto index_url = index_path(url);
  auto index_source = opener(index_url);
  if (!index_source) {
    throw ShardError("shard " + url + " has no index object " + index_url +
                     " (index the shards where they were written, with trainrun index, and "
                     "upload each .idx beside its shard)");
  }
  auto shard = std::make_unique<ShardReader::Shard>();
  if (index_source->size() > kMaxSampleBytes) {
    throw ShardError("shard index " + index_url + " has " + std::to_string(index_source->size()) +
                     " bytes, more than an index of a shard may hold");
  }
  std::string index_bytes;
  try {
    index_bytes = index_source->read(0, index_source->size());
  } catch (const ShardError& error) {
    throw ShardError("shard index " + index_url + ": " + error.what());
  }
  shard->index = ShardIndex::parse(index_bytes, index_url);
  shard->source = std::move(source);
  return shard;
}

}  // namespace

ShardIndex index_local_shard(const std::string& path) {
  const sources::LocalFile file(path);
  const auto mapping = file.map();
  return index_shard(mapping.bytes(), "shard " + path);
}

ShardReader::ShardReader(const std::string& spec, ShardOpener opener) {
  std::vector<std::string> paths;
  try {
    paths = expand_shards(spec);
  } catch (const std::invalid_argument& error) {
    throw ShardError(error.what());
  }
  for (auto& path : paths) {
    auto shard = path.rfind("s3://", 0) == 0 ? open_remote(path, opener) : open_local(path);
    if (shard->index.shard_bytes != shard->source->size()) {
      throw ShardError("the index of shard " + path + " describes a shard of " +
                       std::to_string(shard->index.shard_bytes) + " bytes, but it has " +
                       std::to_string(shard->source->size()) +
                       ": it is stale (index the shard again: trainrun index " + path + ")");
    }
    for (const auto& sample : shard->index.samples) bytes_ += sample.second;
    remote_ = remote_ || shard->source->remote();
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

std::pair<uint64_t, uint64_t> ShardReader::extent(size_t shard, uint64_t local) const {
  return shards_.at(shard)->index.samples.at(local);
}

const ShardSource& ShardReader::source(size_t shard) const { return *shards_.at(shard)->source; }

Sample ShardReader::read(uint64_t index) const {
  const auto [shard, local] = locate(index);
  const auto& [offset, length] = shards_[shard]->index.samples[local];
  const std::string where = "shard " + paths_[shard] + ", sample " + std::to_string(local);
  if (length > kMaxSampleBytes) {
    throw ShardError(where + ": the index gives it " + std::to_string(length) +
                     " bytes, more than the 1 GiB a sample may hold");
  }
  // Uninitialised: the read fills it, and nothing copies it after.
  std::shared_ptr<char[]> bytes(new char[length]);
  try {
    shards_[shard]->source->read(offset, length, bytes.get());
  } catch (const ShardError& error) {
    throw ShardError(where + ": " + error.what());
  }
  const std::string_view view(bytes.get(), length);
  return parse_sample(view, std::move(bytes), where);
}

}  // namespace train
