// ShardDataset: samples read by index and turned into examples on the
// loader's threads.

#include <train/shards.h>

#include <unordered_set>

#include "data/shards/chunk_cache.h"
#include "data/shards/disk_cache.h"
#include "data/shards/prefetcher.h"
#include "data/shards/skipped.h"
#include "data/sources/object.h"

namespace train {

ShardDataset::ShardDataset(const std::string& spec, Transform transform, ShardOptions options)
    : transform_(std::move(transform)), options_(options) {
  if (!transform_) throw std::invalid_argument("train::ShardDataset: the transform is empty");
  if (options_.chunk_samples() == 0 || options_.shuffle_buffer() == 0) {
    throw std::invalid_argument(
        "train::ShardDataset: chunk_samples and shuffle_buffer must be at least 1");
  }
  reader_ = std::make_shared<const ShardReader>(spec, &sources::Object::open);
  cache_ = std::make_shared<shards::ChunkCache>(options_.cache_bytes());
  prefetcher_ = std::make_shared<shards::Prefetcher>(std::max<size_t>(options_.read_threads(), 1));
  if (!options_.cache_dir().empty() && reader_->remote()) {
    disk_ = std::make_shared<shards::DiskCache>(options_.cache_dir(), options_.cache_dir_bytes());
  }
}

uint64_t ShardDataset::shuffle_buffer() const {
  const uint64_t wanted = options_.shuffle_buffer();
  if (!reader_->remote() || reader_->size() == 0) return wanted;
  const uint64_t mean = std::max<uint64_t>(reader_->bytes() / reader_->size(), 1);
  const uint64_t chunk = options_.chunk_samples();
  const uint64_t fits = std::max<uint64_t>(options_.cache_bytes() / 2 / mean / chunk, 1) * chunk;
  return std::min(wanted, fits);
}

ShardDataset::Chunk ShardDataset::chunk_of(size_t shard, uint64_t local) const {
  // The chunk the assignment reads the sample with.
  const uint64_t chunk = local / options_.chunk_samples();
  const uint64_t first = chunk * options_.chunk_samples();
  const uint64_t last = std::min(first + options_.chunk_samples(), reader_->counts()[shard]) - 1;
  const uint64_t begin = reader_->extent(shard, first).first;
  const auto [end_offset, end_bytes] = reader_->extent(shard, last);
  return {begin, end_offset + end_bytes - begin, static_cast<uint64_t>(shard) << 40 | chunk};
}

std::string ShardDataset::fetch(const ShardReader& reader, shards::DiskCache* disk, size_t shard,
                                const Chunk& chunk) {
  const auto& source = reader.source(shard);
  std::string name;
  if (disk != nullptr) {
    name = shards::DiskCache::name(reader.shards()[shard], source.size(), chunk.begin, chunk.bytes);
    if (auto hit = disk->load(name, chunk.bytes)) return std::move(*hit);
  }
  auto bytes = source.read(chunk.begin, chunk.bytes);
  if (disk != nullptr) disk->store(name, bytes);
  return bytes;
}

Sample ShardDataset::sample(size_t index) const {
  const auto [shard, local] = reader_->locate(index);
  const auto& source = reader_->source(shard);
  // Local: the sample alone, from the page cache (its chunk was read from the
  // disk ahead, in one go, as its block began).
  if (!source.remote()) return reader_->read(index);
  const auto chunk = chunk_of(shard, local);
  // Remote: the chunk in one request, its samples cut from it; a chunk the
  // cache could not hold, the sample alone.
  if (chunk.bytes > options_.cache_bytes() / 2) return reader_->read(index);
  const std::string where =
      "shard " + reader_->shards()[shard] + ", sample " + std::to_string(local);
  shards::ChunkCache::Bytes bytes;
  try {  // fetched here, or by the read-ahead that this read waits for
    bytes = cache_->get(chunk.key, [&] { return fetch(*reader_, disk_.get(), shard, chunk); });
  } catch (const ShardError& error) {
    throw ShardError(where + ": " + error.what());
  }
  const auto [offset, length] = reader_->extent(shard, local);
  const auto view = std::string_view(*bytes).substr(offset - chunk.begin, length);
  return parse_sample(view, std::move(bytes), where);
}

void ShardDataset::read_ahead(const std::vector<size_t>& samples) const {
  uint64_t budget = options_.read_ahead_bytes();
  std::vector<std::pair<size_t, Chunk>> chunks;  // in their first sample's order
  std::unordered_set<uint64_t> seen;
  for (size_t index : samples) {
    const auto [shard, local] = reader_->locate(index);
    const auto chunk = chunk_of(shard, local);
    if (!seen.insert(chunk.key).second) continue;
    if (chunk.bytes > budget) continue;  // a smaller one may fit
    budget -= chunk.bytes;
    chunks.emplace_back(shard, chunk);
  }
  prefetcher_->clear();  // the last block's, not yet begun
  uint64_t queued = 0;
  for (const auto& [shard, chunk] : chunks) {
    const auto& source = reader_->source(shard);
    if (!source.remote()) {
      // On the prefetcher's threads: asking the kernel to read ahead can
      // wait for the disk's queue.
      prefetcher_->add([reader = reader_, source = &source, chunk = chunk] {
        source->will_need(chunk.begin, chunk.bytes);
      });
      continue;
    }
    // At most half the cache ahead: the rest holds the chunks being read
    // from; a chunk the cache could not hold is read a sample at a time.
    if (chunk.bytes > options_.cache_bytes() / 2) continue;
    if ((queued += chunk.bytes) > options_.cache_bytes() / 2) break;
    // The job holds what it reads with, never the prefetcher that runs it.
    prefetcher_->add(
        [reader = reader_, cache = cache_, disk = disk_, shard = shard, chunk = chunk] {
          cache->get(chunk.key, [&] { return fetch(*reader, disk.get(), shard, chunk); });
        });
  }
}

torch::data::Example<> ShardDataset::get(size_t index) {
  Sample sample = this->sample(index);
  try {
    return transform_(sample);
  } catch (const std::exception& error) {
    const auto [shard, local] = reader_->locate(index);
    throw ShardError("shard " + reader_->shards()[shard] + ", sample " + std::to_string(local) +
                     " (" + sample.key + "): " + error.what());
  }
}

std::vector<torch::data::Example<>> ShardDataset::get_batch(c10::ArrayRef<size_t> indices) {
  std::vector<torch::data::Example<>> batch;
  batch.reserve(indices.size());
  std::string first_error;
  for (size_t index : indices) {
    try {
      batch.push_back(get(index));
    } catch (const std::exception& error) {
      if (!options_.skip_bad_samples()) throw;
      if (first_error.empty()) first_error = error.what();
      shards::note_skipped(*skipped_, "train::ShardDataset", error.what());
    }
  }
  if (batch.empty() && !indices.empty()) {
    throw ShardError("every sample of a batch failed; the first: " + first_error);
  }
  return batch;
}

}  // namespace train
