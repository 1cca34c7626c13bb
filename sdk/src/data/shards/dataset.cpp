// ShardDataset: samples read by index and turned into examples on the
// loader's threads.

#include <train/shards.h>

#include "data/shards/chunk_cache.h"
#include "data/shards/prefetcher.h"
#include "data/sources/object.h"

#include <iostream>
#include <unordered_set>

namespace train {
namespace {

constexpr uint64_t kSkipsLogged = 20;  // lines on the log; the count goes on
// Local chunks remembered as read ahead: more than a shuffle block's, fewer
// than the page cache holds.
constexpr size_t kChunksReadAhead = 4096;

}  // namespace

ShardDataset::ShardDataset(const std::string& spec, Transform transform, ShardOptions options)
    : transform_(std::move(transform)), options_(options) {
  if (!transform_) throw std::invalid_argument("train::ShardDataset: the transform is empty");
  if (options_.chunk_samples() == 0 || options_.shuffle_buffer() == 0) {
    throw std::invalid_argument(
        "train::ShardDataset: chunk_samples and shuffle_buffer must be at least 1");
  }
  reader_ = std::make_shared<const ShardReader>(spec, &sources::Object::open);
  cache_ = std::make_shared<shards::ChunkCache>(options_.cache_bytes());
  read_ahead_ = std::make_shared<shards::RecentChunks>(kChunksReadAhead);
  prefetcher_ = std::make_shared<shards::Prefetcher>(std::max<size_t>(options_.read_threads(), 1));
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

Sample ShardDataset::sample(size_t index) const {
  const auto [shard, local] = reader_->locate(index);
  const auto& source = reader_->source(shard);
  const auto chunk = chunk_of(shard, local);
  if (!source.remote()) {
    // Its chunk is read from the disk ahead, in one go, at the first of its
    // samples; each sample is then read alone, from the page cache.
    if (read_ahead_->add(chunk.key)) source.will_need(chunk.begin, chunk.bytes);
    return reader_->read(index);
  }
  // Remote: the chunk in one request, its samples cut from it.
  const std::string where =
      "shard " + reader_->shards()[shard] + ", sample " + std::to_string(local);
  auto bytes = cache_->get(chunk.key, [&] {
    try {
      return source.read(chunk.begin, chunk.bytes);
    } catch (const ShardError& error) {
      throw ShardError(where + ": " + error.what());
    }
  });
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
    if (chunk.bytes > budget) break;
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
      if (read_ahead_->add(chunk.key)) {
        prefetcher_->add([reader = reader_, source = &source, chunk = chunk] {
          source->will_need(chunk.begin, chunk.bytes);
        });
      }
      continue;
    }
    // At most half the cache ahead: the rest holds the chunks being read from.
    if ((queued += chunk.bytes) > options_.cache_bytes() / 2) break;
    prefetcher_->add([reader = reader_, cache = cache_, source = &source, chunk = chunk] {
      cache->get(chunk.key, [&] { return source->read(chunk.begin, chunk.bytes); });
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
      if (skipped_->fetch_add(1) < kSkipsLogged) {
        std::cerr << "train::ShardDataset: skipped " << error.what() << std::endl;
      }
    }
  }
  if (batch.empty() && !indices.empty()) {
    throw ShardError("every sample of a batch failed; the first: " + first_error);
  }
  return batch;
}

}  // namespace train
