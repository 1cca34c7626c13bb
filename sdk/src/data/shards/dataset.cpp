// ShardDataset: samples read by index and turned into examples on the
// loader's threads.

#include <train/shards.h>

#include "data/shards/chunk_cache.h"
#include "data/sources/object.h"

#include <iostream>

namespace train {
namespace {

constexpr uint64_t kSkipsLogged = 20;  // lines on the log; the count goes on

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
}

Sample ShardDataset::read(size_t index) const {
  const auto [shard, local] = reader_->locate(index);
  const auto& source = reader_->source(shard);
  if (!source.remote()) return reader_->read(index);
  // The chunk the assignment reads it with: its samples in one request.
  const uint64_t chunk = local / options_.chunk_samples();
  const uint64_t first = chunk * options_.chunk_samples();
  const uint64_t last = std::min(first + options_.chunk_samples(), reader_->counts()[shard]) - 1;
  const uint64_t begin = reader_->extent(shard, first).first;
  const auto [end_offset, end_bytes] = reader_->extent(shard, last);
  const uint64_t key = static_cast<uint64_t>(shard) << 40 | chunk;
  const std::string where =
      "shard " + reader_->shards()[shard] + ", sample " + std::to_string(local);
  auto bytes = cache_->get(key, [&] {
    try {
      return source.read(begin, end_offset + end_bytes - begin);
    } catch (const ShardError& error) {
      throw ShardError(where + ": " + error.what());
    }
  });
  const auto [offset, length] = reader_->extent(shard, local);
  return parse_sample(std::string_view(*bytes).substr(offset - begin, length), where);
}

torch::data::Example<> ShardDataset::get(size_t index) {
  Sample sample = read(index);
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
