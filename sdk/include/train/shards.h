#pragma once

// Sharded datasets: WebDataset tar shards read by index, each rank its own
// part of every epoch, resumed exactly (docs/data.md).
//
//   auto shards = train::ShardDataset("data/train-{000000..000059}.tar",
//       [](const train::Sample& s) {
//         return torch::data::Example<>(train::npy_tensor(s.at("npy")),
//                                       torch::tensor(train::class_label(s.at("cls"))));
//       });
//   auto loader = train::prepare_data_loader(std::move(shards), options);
//
// The per-sample function runs on the loader's threads (LoaderOptions::workers)
// and may be called from several at once.

#include <train/context.h>
#include <train/data.h>
#include <train/shard_files.h>

#include <torch/arg.h>
#include <torch/data.h>

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace train {

namespace shards {
class ChunkCache;
class DiskCache;
class Prefetcher;
class EpochPlan;
struct Segment;
}  // namespace shards

/// How a sharded dataset is read (beside LoaderOptions' batch size, shuffle,
/// seed and padding).
struct ShardOptions {
  /// Consecutive samples of a shard read together; the epoch's order is a
  /// permutation of these chunks, so a chunk is one read (docs/data.md).
  TORCH_ARG(uint64_t, chunk_samples) = 64;
  /// Samples each rank mixes together: it reads its part in blocks of this
  /// many, each block in an order of its own. For shards in object storage it
  /// is cut to what half of cache_bytes holds (the shards' mean sample size
  /// from their indexes), so that a block's chunks are read once.
  TORCH_ARG(uint64_t, shuffle_buffer) = 8192;
  /// Bytes of chunks of object-storage (s3://) shards held in memory per
  /// rank: a chunk is read in one ranged request, ahead of the loader or when
  /// one of its samples is first wanted, and serves its other samples from here.
  TORCH_ARG(uint64_t, cache_bytes) = uint64_t{256} << 20;
  /// A local directory that keeps chunks of object-storage shards for the
  /// next epochs (empty: none), shared by the ranks of a host, at most
  /// cache_dir_bytes (the files used least recently go first).
  TORCH_ARG(std::string, cache_dir) = "";
  TORCH_ARG(uint64_t, cache_dir_bytes) = uint64_t{16} << 30;
  /// Bytes of the next chunks read ahead per rank as the loader enters each
  /// block of the shuffle: local chunks from the disk into the page cache (one
  /// sequential read each), remote ones into the cache above (at most half
  /// of it), on read_threads threads.
  TORCH_ARG(uint64_t, read_ahead_bytes) = uint64_t{128} << 20;
  /// Threads that read chunks ahead (for remote shards, ranged requests at once).
  TORCH_ARG(size_t, read_threads) = 8;
  /// A sample that cannot be read or parsed, or whose per-sample function
  /// throws, is left out of its batch and counted (skipped(), and one line on
  /// the worker's log for the first ones), rather than ending the run.
  TORCH_ARG(bool, skip_bad_samples) = false;
};

/// A tensor from a field holding a NumPy .npy file (as numpy.save writes it:
/// little-endian bool, integer or floating point, C order). Throws ShardError
/// for anything else, naming what it found.
torch::Tensor npy_tensor(std::string_view bytes);
/// The bytes of numpy.save for a tensor (bool, integer or floating point, on
/// the CPU, made contiguous): an "npy" field that Python's numpy reads.
/// Throws ShardError for another dtype.
std::string npy_bytes(const torch::Tensor& tensor);
/// A tensor from a field holding torch.save's bytes of one tensor (WebDataset's
/// "pt"). Throws ShardError when they hold no tensor.
torch::Tensor pt_tensor(std::string_view bytes);
/// The integer of a "cls" field (decimal text, as WebDataset writes it).
/// Throws ShardError for anything else.
int64_t class_label(std::string_view bytes);

/// The samples of shards (expand_shards' spec: local paths, or s3:// objects
/// read with the run's S3 settings), each turned into a
/// torch::data::Example<> by a function of yours. Copies share the shards.
class ShardDataset
    : public torch::data::datasets::Dataset<ShardDataset, torch::data::Example<>> {
 public:
  using Transform = std::function<torch::data::Example<>(const Sample&)>;

  /// Opens the shards (indexing those without an index). Throws ShardError
  /// for a shard that is missing, corrupt or whose index is stale, and
  /// std::invalid_argument for an empty transform.
  ShardDataset(const std::string& spec, Transform transform, ShardOptions options = {});

  /// Sample `index` (shard after shard), transformed. Throws what reading or
  /// the transform throws, as ShardError naming the shard and the sample.
  torch::data::Example<> get(size_t index) override;
  /// Sample `index` as the shard holds it, without the transform. Throws
  /// ShardError naming the shard and the sample when it cannot be read.
  Sample sample(size_t index) const;
  /// Starts reading the chunks of `samples` ahead, in their order, up to
  /// read_ahead_bytes; returns at once. The loader's sampler calls it as each
  /// block of the shuffle begins (prepare_data_loader connects them).
  void read_ahead(const std::vector<size_t>& samples) const;
  /// The samples at `indices`; with skip_bad_samples, without those that fail.
  std::vector<torch::data::Example<>> get_batch(c10::ArrayRef<size_t> indices) override;
  c10::optional<size_t> size() const override { return static_cast<size_t>(reader_->size()); }

  const ShardReader& reader() const { return *reader_; }
  const ShardOptions& options() const { return options_; }
  /// The shuffle buffer in use: shuffle_buffer, or for shards in object
  /// storage what half the chunk cache holds, if less (a multiple of
  /// chunk_samples, at least one chunk).
  uint64_t shuffle_buffer() const;
  /// Samples skipped so far (skip_bad_samples), by every copy.
  uint64_t skipped() const { return skipped_->load(); }

 private:
  // The chunk `index` is read with: its first sample's offset, its bytes,
  // and a key for it.
  struct Chunk {
    uint64_t begin, bytes, key;
  };
  Chunk chunk_of(size_t shard, uint64_t local) const;
  // A remote chunk's bytes: from the cache directory, else from the store
  // (and then kept there).
  static std::string fetch(const ShardReader& reader, shards::DiskCache* disk, size_t shard,
                           const Chunk& chunk);

  std::shared_ptr<const ShardReader> reader_;
  std::shared_ptr<shards::ChunkCache> cache_;          // remote chunks' bytes
  std::shared_ptr<shards::Prefetcher> prefetcher_;    // reads ahead
  std::shared_ptr<shards::DiskCache> disk_;           // cache_dir's, or none
  Transform transform_;
  ShardOptions options_;
  std::shared_ptr<std::atomic<uint64_t>> skipped_ = std::make_shared<std::atomic<uint64_t>>(0);
};

/// This rank's samples of a sharded dataset in each epoch (docs/data.md, "The
/// assignment"): a pure function of the shards' sample counts, the seed, the
/// epoch, the world size and the rank, and of the world sizes the epoch ran
/// under before, so that a group that comes back with another size reads
/// exactly what no rank consumed yet. Copies share their state, as
/// DistributedSampler's do.
class ShardSampler : public torch::data::samplers::Sampler<> {
 public:
  /// Its saved position is where a loader is (the Trainer saves it).
  static constexpr bool kSavesPosition = true;

  /// `counts`: samples per shard. Throws std::invalid_argument for a chunk or
  /// buffer of 0.
  ShardSampler(std::vector<uint64_t> counts, const Context& ctx, bool shuffle,
               bool allow_duplicates, uint64_t seed, const ShardOptions& options);
  ~ShardSampler() override;
  ShardSampler(const ShardSampler&) = default;
  ShardSampler& operator=(const ShardSampler&) = default;

  /// The epoch the next reset starts. An epoch other than the one whose
  /// position was loaded starts from its beginning.
  void set_epoch(size_t epoch);
  /// The next reset that starts `epoch` starts at this rank's item `position`
  /// of the world size it runs under (a resume or a replacement).
  void resume(size_t epoch, size_t position);
  void reset(c10::optional<size_t> new_size = c10::nullopt) override;
  c10::optional<std::vector<size_t>> next(size_t batch_size) override;
  /// A loader handed the train function its next batch (the count is not
  /// used: a batch may hold fewer samples, some skipped, and still be the
  /// batch it was).
  void yielded(size_t samples);
  /// The position: the epoch, the world sizes it ran under and what each
  /// consumed, and the items this rank's world consumed of the current one
  /// (handed out, not read ahead), with the shards' sample counts.
  void save(torch::serialize::OutputArchive& archive) const override;
  /// Takes a saved position; a world of another size goes on with what no
  /// rank consumed. Throws std::runtime_error when it was saved for shards of
  /// other sample counts.
  void load(torch::serialize::InputArchive& archive) override;

  /// Calls `hook` with the samples of each block of this rank's order as
  /// next() enters it (prepare_data_loader's: the dataset reads them ahead).
  void on_block(std::function<void(const std::vector<size_t>&)> hook);

  /// Items this rank gets in the epoch (what is left of it, once resumed under
  /// another world size).
  size_t local_size() const;
  /// The epoch set, and the item a loaded or resumed position starts at.
  size_t epoch() const;
  size_t resume_position() const;

 private:
  struct State;
  std::shared_ptr<State> state_;
};

namespace detail {
/// The ShardSampler of prepare_data_loader, for samples in shards of `counts`
/// read with `sampler_options`; every rank must call it with the same
/// counts: it checks them (one small collective) and throws
/// std::runtime_error on every rank, naming them, when they differ.
ShardSampler shard_sampler(const std::vector<uint64_t>& counts,
                           const ShardOptions& sampler_options, const LoaderOptions& options);
}  // namespace detail

/// prepare_data_loader for a sharded dataset: each rank reads its part
/// through a ShardSampler. Every rank must call it with the same shards: it
/// checks their sample counts (one small collective) and throws
/// std::runtime_error on every rank, naming them, when they differ.
DataLoader<ShardDataset, ShardSampler> prepare_data_loader(ShardDataset dataset,
                                                           const LoaderOptions& options = {});

}  // namespace train
