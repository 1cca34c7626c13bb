#pragma once

#include <train/abi.h>
#include <train/context.h>

#include <torch/arg.h>
#include <torch/data.h>
#include <torch/serialize/archive.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace train {

/// Options of prepare_data_loader (like torch::data::DataLoaderOptions).
struct LoaderOptions {
  /// Samples per batch on each worker. The global batch is batch_size x world_size.
  TORCH_ARG(size_t, batch_size) = 32;
  /// A new order every epoch (set_epoch), the same on every rank; else in order.
  TORCH_ARG(bool, shuffle) = true;
  /// Drop each rank's last, incomplete batch.
  TORCH_ARG(bool, drop_last) = false;
  /// The shuffle's seed: epoch e is shuffled with seed + e, the same on every
  /// rank (DistributedSampler's seed).
  TORCH_ARG(uint64_t, seed) = 0;
  /// Background threads that make batches ahead of the train loop (LibTorch's
  /// DataLoader workers, each with batches in flight); they call the
  /// dataset's get() at the same time. None given: 2 for a TensorDataset on a
  /// CUDA device, where the next batches are gathered while the GPU computes;
  /// 0 otherwise (a get() of your own need not be thread-safe, and on the CPU
  /// loader threads would take cores from the step itself).
  TORCH_ARG(c10::optional<size_t>, workers) = c10::nullopt;
  /// Batches made ahead of the train loop by the workers at most (LibTorch's
  /// max_jobs; at least one). None given: two per worker.
  TORCH_ARG(c10::optional<size_t>, prefetch) = c10::nullopt;
  /// Pad with repeated samples so every rank gets as many batches as the others
  /// (every rank must run the same number of backward passes); false gives each
  /// sample to at most one rank, for evaluation: when the world size does not
  /// divide the dataset, size % world_size samples are left out (shuffled, a
  /// different few every epoch; in order, the last ones).
  TORCH_ARG(bool, allow_duplicates) = true;
  /// Shows where this loader is (epoch, batch of batches) in the run's progress
  /// display, from rank 0. The loader shown is the first to begin an epoch
  /// while no other shown loader is alive; a training loader (allow_duplicates)
  /// takes over from an evaluation loader. Only a loader iterated on the train
  /// function's own thread is shown.
  TORCH_ARG(bool, progress) = true;
  /// Ends every epoch after this many batches (0: all of them), as Lightning's
  /// limit_train_batches does; the progress display and its ETA count this many.
  TORCH_ARG(size_t, max_batches) = 0;
};

namespace detail {

/// A point between steps on the train function's thread (a loader's next
/// batch, `batch_done`, or epoch, a report): where the profile of the run's
/// profile steps (trainrun --profile-steps) starts and stops. Nothing elsewhere.
void profile_point(bool batch_done = false);

/// A batch on `device`. On a CUDA device the copy (from pinned memory,
/// non_blocking) runs on a copy stream of its own, and the current stream
/// waits for it through an event: it overlaps the compute still queued before
/// it rather than waiting behind it. Elsewhere a plain copy.
torch::data::Example<> to_device(const torch::data::Example<>& batch, c10::Device device);

/// A loader's side of the progress display: claims it at begin() and sends
/// its epoch and batches through the host table, which never blocks (the host
/// drops what it does not forward). One per DataLoader; calls from any thread
/// but the train function's do nothing.
class LoaderProgress {
 public:
  explicit LoaderProgress(bool evaluation) : evaluation_(evaluation) {}
  ~LoaderProgress();
  LoaderProgress(const LoaderProgress&) = delete;
  LoaderProgress& operator=(const LoaderProgress&) = delete;

  /// Whether this loader is (now) the one shown: rank 0, a host that takes
  /// progress, and no other shown loader alive (or only an evaluation one).
  bool claim();
  /// A new epoch of `batches` batches (0: not known), from batch `first` (an
  /// epoch resumed part-way); `epoch` is set_epoch's, or -1 to count the
  /// epochs begun.
  void begin_epoch(int64_t epoch, int64_t batches, int64_t first = 0);
  void batch_done(int64_t samples);

 private:
  bool evaluation_;
  int64_t epochs_begun_ = 0;  // shown, for loaders without set_epoch
};

/// A loop over a loader's epochs() (docs/design.md, "A replacement catches
/// up"). begin_epochs_loop: the loop starts, over a loader that can start an
/// epoch part-way (`resumable`); it returns whether it is the loop that takes
/// replacements (with in-place recovery, the train function's first), and on
/// a replacement, having taken the state its peer sent, the epoch and batch
/// it starts at. epochs_loop_boundary: that loop's loader finished a batch;
/// `next` is the next one's index in `epoch`: a replacement due joins there,
/// unless gradients wait for an optimizer. end_epochs_loop: that loop ended.
struct LoopStart {
  bool takes_replacement = false;
  c10::optional<std::pair<size_t, size_t>> at;
};
LoopStart begin_epochs_loop(bool resumable);
/// That loop's loader begins an epoch's first pass: the top of the epoch's
/// body is behind.
void epochs_loop_pass_begins();
void epochs_loop_boundary(size_t epoch, size_t next);
void end_epochs_loop();

}  // namespace detail

/// Samples for this rank, as PyTorch's DistributedSampler chooses them.
///
/// Shuffled: every epoch, a permutation of the whole dataset drawn from a
/// generator seeded with seed + epoch (torch::randperm, the same on every
/// rank); it is then padded by repeating its start (allow_duplicates) or cut
/// short, to a multiple of the world size, and rank r takes every world-th
/// index from r on. Which samples are repeated or left out changes with the
/// epoch, and the indices are PyTorch's for the same seed, epoch and size.
/// In order: rank r reads a contiguous block of the padded or cut range (PyTorch
/// strides), padded by wrapping round to the first samples.
class DistributedSampler : public torch::data::samplers::Sampler<> {
 public:
  DistributedSampler(size_t size, const Context& ctx, bool shuffle, bool allow_duplicates,
                     uint64_t seed = 0);

  /// Chooses the epoch's order (shuffled: the permutation); takes effect at the
  /// next reset, which the loader makes when an epoch begins.
  void set_epoch(size_t epoch) { state_->epoch = epoch; }
  /// The next reset that starts `epoch` starts at this rank's index
  /// `position` instead of the first (a resume in the middle of an epoch).
  void resume(size_t epoch, size_t position) { state_->resume.emplace(epoch, position); }
  /// Starts the epoch: this rank's indices for it, from the first (or from
  /// where `load` left off, once, in the epoch it loaded).
  void reset(c10::optional<size_t> new_size = c10::nullopt) override;
  /// The next `batch_size` indices (fewer at the end), or none when done.
  c10::optional<std::vector<size_t>> next(size_t batch_size) override;
  /// A loader handed `samples` more of this epoch's indices to the train
  /// function (0: it began the epoch). From then until the next reset, save()
  /// counts these, not the indices its threads asked for ahead.
  void yielded(size_t samples);
  /// The epoch and how many of its indices were used: those a loader handed
  /// out (yielded), or without a loader, those next() gave. Under the names of
  /// LibTorch's DistributedRandomSampler, so that either loads the other's.
  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;

  /// Samples this rank gets in an epoch, computed without touching the
  /// sampler's state, which copies share.
  size_t local_size() const;
  /// The epoch set (or loaded), and the index a loaded or resumed position
  /// starts that epoch at (0: its first).
  size_t epoch() const { return state_->epoch; }
  size_t resume_position() const;

 private:
  // Shared by copies: the loader starts each epoch on a copy.
  struct State {
    size_t size = 0;
    size_t epoch = 0;
    std::vector<size_t> indices;                      // this rank's, this epoch
    size_t start = 0;                                 // where the epoch started (a resume's)
    size_t position = 0;                              // how many of them next() has given
    c10::optional<size_t> yielded;                    // ... a loader handed out, counting
    c10::optional<std::pair<size_t, size_t>> resume;  // load's epoch and position
  };
  std::shared_ptr<State> state_ = std::make_shared<State>();
  size_t replicas_, rank_;
  bool shuffle_, allow_duplicates_;
  uint64_t seed_;
};

namespace detail {
/// Throws std::runtime_error on every rank, naming the sizes, unless every
/// rank passes the same `size`. A collective: one allgather of 8 bytes per rank.
void check_same_dataset_size(size_t size, const char* caller);
/// Throws std::runtime_error on every rank, saying `what` and naming the
/// ranks, unless every rank passes the same `value`. A collective, as above.
void check_same_on_every_rank(int64_t value, const char* caller, const std::string& what);

/// Whether a sampler's saved position is the whole of where a loader is, so
/// that the Trainer saves it (a ShardSampler's: it holds the world sizes an
/// epoch ran under), rather than the batch it is at.
template <typename S, typename = void>
struct saves_position : std::false_type {};
template <typename S>
struct saves_position<S, std::void_t<decltype(S::kSavesPosition)>>
    : std::bool_constant<S::kSavesPosition> {};
}  // namespace detail

/// Whether a dataset's batches are stacked already: it was mapped with
/// torch::data::transforms::Stack<>(), as LibTorch's own examples write it.
template <typename Dataset>
inline constexpr bool is_stacked_v =
    std::is_same_v<typename Dataset::BatchType, torch::data::Example<>>;

/// A dataset of whole tensors, as PyTorch's TensorDataset: sample i is
/// data[i] with target[i]. The loader asks it for a batch at once, and it
/// gathers the batch with one index_select per tensor, straight into
/// page-locked memory when the loader feeds a CUDA device: no per-sample
/// tensors, no stacking, no second copy to pin. Prepare the data once (decode,
/// normalise) and hand the result here, rather than doing it in a get() per
/// sample. The tensors may live on a CUDA device already (the whole dataset
/// resident in GPU memory, for data that fits): batches are then gathered
/// there. Copies share the tensors; get_batch may be called from several
/// loader threads at once.
class TensorDataset
    : public torch::data::datasets::BatchDataset<TensorDataset, torch::data::Example<>,
                                                 c10::ArrayRef<size_t>> {
 public:
  /// `data` and `target` hold one sample per row of their first dimension.
  /// Throws std::invalid_argument when they are undefined, scalars, of
  /// different lengths, or on different devices.
  TensorDataset(torch::Tensor data, torch::Tensor target);

  /// The samples at `indices`, gathered (one index_select each). Throws
  /// std::out_of_range for an index past the end.
  torch::data::Example<> get_batch(c10::ArrayRef<size_t> indices) override;
  c10::optional<size_t> size() const override { return static_cast<size_t>(data_.size(0)); }

  /// A copy of the dataset on `device`: on a GPU, the whole dataset resident in
  /// its memory, each batch gathered there with no copy from the host (the
  /// loader's copy to the device is then a no-op). For data that fits: throws
  /// std::runtime_error, naming the sizes, when the tensors not there yet
  /// would take more than `max_fraction` of the device's free memory
  /// (cudaMemGetInfo), or when that cannot be told; std::invalid_argument
  /// when max_fraction is not in (0, 1]. Ranks that share a GPU each see the
  /// same free memory: give each its share.
  TensorDataset to(torch::Device device, double max_fraction = 0.5) const;
  /// The bytes of both tensors.
  size_t nbytes() const;

  /// Whether batches of host tensors are gathered into page-locked memory; the
  /// loader sets it when it feeds a CUDA device.
  void pin_memory(bool pin) { pin_ = pin; }
  const torch::Tensor& data() const { return data_; }
  const torch::Tensor& target() const { return target_; }

 private:
  torch::Tensor data_, target_;
  bool pin_ = false;
};

namespace detail {

/// Puts a batch in page-locked host memory when `pin` is set, so that its copy
/// to a CUDA device can overlap work already queued there. Runs where the batch
/// is made: on LibTorch's loader threads when the loader has workers.
struct PinMemory
    : torch::data::transforms::BatchTransform<torch::data::Example<>, torch::data::Example<>> {
  explicit PinMemory(bool pin = false) : pin(pin) {}
  torch::data::Example<> apply_batch(torch::data::Example<> batch) override {
    if (!pin) return batch;
    return {pinned(std::move(batch.data)), pinned(std::move(batch.target))};
  }
  // Host memory only: a dataset may already hand out CUDA tensors.
  static torch::Tensor pinned(torch::Tensor t) {
    return t.is_cpu() && !t.is_pinned() ? t.pin_memory() : t;
  }
  bool pin;
};

}  // namespace detail

/// Batches of a dataset for this rank, on this worker's device. Iterate it with
/// a range-for; call set_epoch(epoch) before each epoch for a new shuffle.
/// Each batch is a torch::data::Example<> (data and target stacked). On a CUDA
/// device, batches are made in pinned host memory and copied with
/// non_blocking on a copy stream, which the current stream waits for through
/// an event: the copy overlaps the work queued before it, and the host does
/// not wait.
template <typename Dataset, typename Sampler = DistributedSampler>
class DataLoader {
 public:
  using Batch = torch::data::Example<>;
  using SamplerType = Sampler;
  /// The dataset as the loader reads it: stacked by the loader, unless it is already.
  using Stacked = std::conditional_t<
      is_stacked_v<Dataset>, Dataset,
      torch::data::datasets::MapDataset<Dataset, torch::data::transforms::Stack<>>>;
  /// ... then pinned for a CUDA device.
  using Pinned = torch::data::datasets::MapDataset<Stacked, detail::PinMemory>;
  using Inner = torch::data::StatelessDataLoader<Pinned, Sampler>;
  /// Where the loader is: the epoch begun last, and the index of the batch
  /// after the last one finished. `armed`: a loop over epochs() that takes
  /// replacements set an epoch, whose first pass (`driving`) has its batch
  /// boundaries; another pass over the loader in the same epoch has none.
  struct Position {
    size_t epoch = 0;
    size_t next = 0;
    bool armed = false;
    bool driving = false;
  };

  DataLoader(const DataLoader&) = delete;  // a copy would share the inner loader
  DataLoader& operator=(const DataLoader&) = delete;
  DataLoader(DataLoader&&) = default;
  DataLoader& operator=(DataLoader&&) = default;

  DataLoader(Dataset dataset, Sampler sampler, const LoaderOptions& options, c10::Device device)
      : dataset_(std::move(dataset)),
        sampler_(std::move(sampler)),
        options_(options),
        device_(device) {
    if (options_.batch_size() == 0) {
      throw std::invalid_argument("train::DataLoader: batch_size must be at least 1");
    }
    if (options_.progress()) {
      progress_ = std::make_shared<detail::LoaderProgress>(!options_.allow_duplicates());
    }
  }

  /// Reseeds the shuffle: every rank gets a new, consistent order for this
  /// epoch. The progress display shows this epoch, counted from 0 as PyTorch's
  /// DistributedSampler counts them (without set_epoch it counts the epochs
  /// begun).
  void set_epoch(size_t epoch) {
    if constexpr (has_set_epoch<Sampler>::value) sampler_.set_epoch(epoch);
    // A dataset's own random numbers (an ImageDataset's crops) follow the epoch too.
    if constexpr (has_set_epoch<Dataset>::value) dataset_.set_epoch(epoch);
    epoch_ = static_cast<int64_t>(epoch);
  }

  /// The epoch set by set_epoch starts at its batch `batches`: the sampler
  /// skips the ones before without reading them (unless another epoch is set
  /// before it begins). Returns false, and skips nothing, when the sampler
  /// cannot (it has no resume(epoch, position)); then read and drop them.
  bool resume(size_t batches) {
    if constexpr (has_resume<Sampler>::value) {
      const auto epoch = static_cast<size_t>(std::max<int64_t>(epoch_, 0));
      sampler_.resume(epoch, batches * options_.batch_size());
      resumed_ = std::make_pair(epoch, batches);  // of max_batches, already done
      return true;
    } else {
      return false;
    }
  }

  /// Saves where the loader is: the epoch and the samples this rank was handed
  /// in it (not those its threads read ahead), for a checkpoint. Any rank's is
  /// the group's: save it with the model from one rank.
  void save(torch::serialize::OutputArchive& archive) const { sampler_.save(archive); }
  void save(const std::string& file) const {
    torch::serialize::OutputArchive archive;
    save(archive);
    archive.save_to(file);
  }
  /// Takes a saved position: the next epoch begun, when it is the saved one,
  /// starts where it was, reading nothing before (with a ShardSampler, also
  /// under another world size: it then reads what no rank was handed). Returns
  /// that epoch, to start a loop of epochs at. Throws what the sampler's load
  /// throws for a position it cannot take.
  size_t load(torch::serialize::InputArchive& archive) {
    sampler_.load(archive);
    epoch_ = static_cast<int64_t>(sampler_.epoch());
    if constexpr (has_set_epoch<Dataset>::value) dataset_.set_epoch(sampler_.epoch());
    const size_t position = sampler_.resume_position();
    resumed_.reset();
    if (position > 0) {
      resumed_ = std::make_pair(sampler_.epoch(), position / options_.batch_size());
    }
    batches_ = -1;  // what is left of the epoch may be another count
    return sampler_.epoch();
  }
  size_t load(const std::string& file) {
    torch::serialize::InputArchive archive;
    archive.load_from(file);
    return load(archive);
  }

  /// Batches on this rank in one epoch, at most max_batches. With the
  /// DistributedSampler it is counted on a fresh sampler; another sampler is
  /// run through on a copy.
  size_t size() const {
    const size_t most = options_.max_batches();
    if constexpr (has_local_size<Sampler>::value) {
      const size_t samples = sampler_.local_size();
      const size_t batch = options_.batch_size();
      const size_t all = options_.drop_last() ? samples / batch : (samples + batch - 1) / batch;
      return most > 0 ? std::min(all, most) : all;
    } else {
      Sampler sampler = sampler_;
      sampler.reset(dataset_.size().value());
      size_t batches = 0;
      while (auto indices = sampler.next(options_.batch_size())) {
        if (!options_.drop_last() || indices->size() == options_.batch_size()) ++batches;
        if (most > 0 && batches == most) break;
      }
      return batches;
    }
  }

  /// Forward iterator over this epoch's batches; moves each batch to the device once.
  class Iterator {
   public:
    using InnerIterator = torch::data::Iterator<Batch>;
    /// `limit`: the batches it yields at most (none: no limit).
    /// `position`: the loader's, which operator++ moves on. `inner`: the
    /// loader `it` reads from, kept while the iterator is (a begin() that
    /// follows makes another).
    /// `sampler`: told of each batch handed out, where it counts them (null: none).
    Iterator(std::shared_ptr<Inner> inner, InnerIterator it, c10::Device device, Position* position,
             detail::LoaderProgress* progress = nullptr, c10::optional<size_t> limit = c10::nullopt,
             Sampler* sampler = nullptr)
        : inner_(std::move(inner)),
          it_(std::move(it)),
          device_(device),
          progress_(progress),
          left_(limit.value_or(0)),
          limited_(limit && *limit == 0),
          position_(position),
          sampler_(sampler) {}
    Batch& operator*() {
      if (!current_) {
        Batch& batch = *it_;
        current_ = device_.is_cpu() ? batch : detail::to_device(batch, device_);
        if constexpr (has_yielded<Sampler>::value) {
          if (sampler_ != nullptr) sampler_->yielded(samples_in(*current_));
        }
      }
      return *current_;
    }
    Iterator& operator++() {
      detail::profile_point(/*batch_done=*/true);
      if constexpr (has_yielded<Sampler>::value) {  // passed over without a look: handed too
        if (sampler_ != nullptr && !current_) sampler_->yielded(samples_in(*it_));
      }
      if (progress_ != nullptr) progress_->batch_done(samples_in(current_ ? *current_ : *it_));
      if (++position_->next; position_->driving) {
        detail::epochs_loop_boundary(position_->epoch, position_->next);
      }
      // At the limit the epoch is over: what the loader threads made ahead is dropped.
      if (left_ > 0 && --left_ == 0) {
        limited_ = true;
      } else {
        ++it_;
      }
      current_.reset();
      return *this;
    }
    bool operator!=(const Iterator& other) const {
      return !limited_ && !other.limited_ && it_ != other.it_;
    }

   private:
    static int64_t samples_in(const Batch& batch) {
      return batch.data.dim() > 0 ? batch.data.size(0) : 1;
    }

    std::shared_ptr<Inner> inner_;
    InnerIterator it_;
    c10::Device device_;
    c10::optional<Batch> current_;
    detail::LoaderProgress* progress_;
    size_t left_;   // batches still to yield under the limit; 0: no limit
    bool limited_;  // the limit was reached
    Position* position_;
    Sampler* sampler_;
  };

  /// The epochs [first, end) of a training loop, each set with set_epoch
  /// before its batches begin:
  ///
  ///   for (size_t epoch : loader.epochs(first_epoch, epochs)) {
  ///     for (auto& batch : loader) { ... }
  ///   }
  ///
  /// With --recovery in-place, the train function's first loop written so
  /// takes a replacement for a lost rank at a boundary between the batches of
  /// each epoch's first pass over this loader, when its optimizer is known to
  /// the SDK (train::optim's, or train::register_optimizer): the
  /// replacement's loop starts at the survivors' epoch, whatever its `first`,
  /// runs that epoch's body from its top (which must make no collective before
  /// the batches), and its loader starts at their next batch, with their
  /// parameters and optimizer state (docs/fault-tolerance.md, "Replacements
  /// in your own loop"). Otherwise the same as setting each epoch in a loop of
  /// your own.
  class Epochs {
   public:
    class Iterator {
     public:
      Iterator(Epochs* epochs, size_t epoch) : epochs_(epochs), epoch_(epoch) {}
      size_t operator*() const { return epoch_; }
      Iterator& operator++() {
        if (++epoch_ < epochs_->end_) epochs_->set(epoch_);
        return *this;
      }
      bool operator!=(const Iterator& other) const { return epoch_ < other.epoch_; }

     private:
      Epochs* epochs_;
      size_t epoch_;
    };

    Epochs(DataLoader* loader, size_t first, size_t end)
        : loader_(loader), first_(first), end_(end) {}
    ~Epochs() {
      if (!driving_) return;
      loader_->position_.armed = loader_->position_.driving = false;
      detail::end_epochs_loop();
    }
    Epochs(const Epochs&) = delete;
    Epochs& operator=(const Epochs&) = delete;

    Iterator begin() {
      auto start = detail::begin_epochs_loop(has_resume<Sampler>::value);
      driving_ = start.takes_replacement;
      const size_t first = start.at ? start.at->first : first_;
      if (first < end_) set(first);
      if (start.at && start.at->second > 0) loader_->resume(start.at->second);
      return Iterator(this, first);
    }
    Iterator end() { return Iterator(this, end_); }

   private:
    void set(size_t epoch) {
      loader_->set_epoch(epoch);
      loader_->position_.armed = driving_;
    }

    DataLoader* loader_;
    size_t first_, end_;
    bool driving_ = false;  // this loop takes replacements
  };

  /// See Epochs.
  Epochs epochs(size_t first, size_t end) { return Epochs(this, first, end); }

  /// Starts an epoch (in the order set by set_epoch).
  Iterator begin() {
    detail::profile_point();
    if constexpr (has_pin_memory<Dataset>::value) dataset_.pin_memory(device_.is_cuda());
    // Built directly: LibTorch 1.13's map() cannot chain onto a stacked dataset.
    inner_ =
        std::make_shared<Inner>(Pinned(stacked(), detail::PinMemory(device_.is_cuda())), sampler_,
                                torch::data::DataLoaderOptions()
                                    .batch_size(options_.batch_size())
                                    .drop_last(options_.drop_last())
                                    .workers(workers())
                                    .max_jobs(max_jobs()));
    // The batches resume() skipped, where this epoch is the one it was for.
    const auto epoch = static_cast<size_t>(std::max<int64_t>(epoch_, 0));
    const size_t resumed = resumed_ && resumed_->first == epoch ? resumed_->second : 0;
    resumed_.reset();
    detail::LoaderProgress* shown = progress_ && progress_->claim() ? progress_.get() : nullptr;
    if (shown != nullptr) {
      // Counted once, and only where a sampler can be counted without running it.
      if constexpr (has_local_size<Sampler>::value) {
        // A sampler that saves its position may leave part of an epoch.
        if (batches_ < 0 || detail::saves_position<Sampler>::value) {
          batches_ = static_cast<int64_t>(size());
        }
      }
      shown->begin_epoch(epoch_, std::max<int64_t>(batches_, 0), static_cast<int64_t>(resumed));
    }
    // What max_batches leaves of an epoch that resumed part-way.
    c10::optional<size_t> limit;
    if (const size_t most = options_.max_batches(); most > 0) {
      limit = most > resumed ? most - resumed : 0;
    }
    position_.epoch = epoch;
    position_.next = resumed;
    position_.driving = std::exchange(position_.armed, false);
    if (position_.driving) detail::epochs_loop_pass_begins();
    auto first = inner_->begin();  // resets the sampler, and starts the threads ahead
    if constexpr (has_yielded<Sampler>::value) sampler_.yielded(0);
    return Iterator(inner_, std::move(first), device_, &position_, shown, limit, &sampler_);
  }
  Iterator end() { return Iterator(inner_, inner_->end(), device_, &position_); }

  /// The batches of the epoch begun last that are done: finished in the
  /// loop over it, or skipped by resume() (a replacement's loop over epochs()
  /// starts part-way). The index of the batch being trained, while it is.
  size_t batches_done() const { return position_.next; }

  /// Batches made ahead: LoaderOptions::prefetch (at least one), or two per
  /// worker; none without workers.
  size_t max_jobs() const {
    if (workers() == 0) return 0;
    return std::max<size_t>(options_.prefetch().value_or(2 * workers()), 1);
  }

  /// The loader threads in use (LoaderOptions::workers, or its default for the device).
  size_t workers() const {
    if (options_.workers()) return *options_.workers();
    return device_.is_cuda() && std::is_same_v<Dataset, TensorDataset> ? kDefaultCudaWorkers : 0;
  }

 private:
  static constexpr size_t kDefaultCudaWorkers = 2;

  Stacked stacked() {
    if constexpr (is_stacked_v<Dataset>) {
      return dataset_;
    } else {
      return dataset_.map(torch::data::transforms::Stack<>());
    }
  }

  template <typename S, typename = void>
  struct has_local_size : std::false_type {};
  template <typename S>
  struct has_local_size<S, std::void_t<decltype(std::declval<const S&>().local_size())>>
      : std::true_type {};
  template <typename S, typename = void>
  struct has_resume : std::false_type {};
  template <typename S>
  struct has_resume<S, std::void_t<decltype(std::declval<S&>().resume(size_t{0}, size_t{0}))>>
      : std::true_type {};
  template <typename S, typename = void>
  struct has_yielded : std::false_type {};
  template <typename S>
  struct has_yielded<S, std::void_t<decltype(std::declval<S&>().yielded(size_t{0}))>>
      : std::true_type {};
  template <typename D, typename = void>
  struct has_pin_memory : std::false_type {};
  template <typename D>
  struct has_pin_memory<D, std::void_t<decltype(std::declval<D&>().pin_memory(true))>>
      : std::true_type {};
  template <typename S, typename = void>
  struct has_set_epoch : std::false_type {};
  template <typename S>
  struct has_set_epoch<S, std::void_t<decltype(std::declval<S&>().set_epoch(size_t{0}))>>
      : std::true_type {};

  Dataset dataset_;
  Sampler sampler_;
  LoaderOptions options_;
  c10::Device device_;
  std::shared_ptr<Inner> inner_;  // the last begin()'s; its iterators keep theirs
  std::shared_ptr<detail::LoaderProgress> progress_;  // with LoaderOptions::progress
  int64_t epoch_ = -1;                                // set_epoch's; -1: never set
  int64_t batches_ = -1;                              // per epoch, once counted
  // resume()'s epoch and the batches it skipped there, for the next begin().
  c10::optional<std::pair<size_t, size_t>> resumed_;
  Position position_;
};

/// Shards a LibTorch dataset across ranks, like Ray Train's prepare_data_loader:
/// each rank reads its part through a DistributedSampler, and each batch
/// arrives on this worker's device. The dataset is any
/// torch::data::datasets::Dataset whose examples are torch::data::Example<>,
/// as it is or already mapped with torch::data::transforms::Stack<>().
/// Every rank must call it, with a dataset of the same size: it checks the
/// sizes (one small collective) and throws std::runtime_error on every rank,
/// naming them, when they differ. Throws std::logic_error outside a train
/// function started by trainrun.
template <typename Dataset>
DataLoader<Dataset> prepare_data_loader(Dataset dataset, const LoaderOptions& options = {}) {
  auto ctx = get_context();
  const size_t size = dataset.size().value();
  if (ctx.world_size() > 1) detail::check_same_dataset_size(size, "prepare_data_loader");
  DistributedSampler sampler(size, ctx, options.shuffle(), options.allow_duplicates(),
                             options.seed());
  return DataLoader<Dataset>(std::move(dataset), std::move(sampler), options, ctx.device());
}

/// The same with a sampler of your own (which then decides what this rank reads).
template <typename Dataset, typename Sampler>
DataLoader<Dataset, Sampler> prepare_data_loader(Dataset dataset, Sampler sampler,
                                                 const LoaderOptions& options = {}) {
  return DataLoader<Dataset, Sampler>(std::move(dataset), std::move(sampler), options,
                                      get_context().device());
}

}  // namespace train
