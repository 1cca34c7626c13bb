// ImageDataset: samples from shards or an ImageFolder, each made into its
// place in the batch by the pipeline on the loader thread that asked for the
// batch; and prepare_data_loader for it.

#include <train/images.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <mutex>

#include "data/shards/skipped.h"

namespace train {
namespace {

uint64_t mix(uint64_t x) {  // splitmix64's finaliser
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// A sample's random numbers: splitmix64 from (seed, epoch, index), drawn as
// torch draws a float32 (24 bits) and an integer (a remainder).
class SampleRandom : public ImageRandom {
 public:
  SampleRandom(uint64_t seed, uint64_t epoch, uint64_t index)
      : state_(mix(mix(mix(seed) ^ epoch) ^ index)) {}
  float uniform(float low, float high) override {
    const auto bits = static_cast<uint32_t>(next() >> 40);
    return static_cast<float>(bits * 0x1.0p-24) * (high - low) + low;
  }
  int64_t integer(int64_t low, int64_t high) override {
    if (high <= low) return low;
    return low + static_cast<int64_t>(next() % static_cast<uint64_t>(high - low));
  }

 private:
  uint64_t next() { return mix(state_++); }
  uint64_t state_;
};

// The sample's fields live in its file's bytes and its label's text.
struct FileSample {
  std::string bytes, label;
};

std::string lower_extension(const std::filesystem::path& path) {
  auto extension = path.extension().string();
  if (!extension.empty()) extension.erase(0, 1);
  std::transform(extension.begin(), extension.end(), extension.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return extension;
}

}  // namespace

// Batches' tensors for the CPU, used again once nothing holds them: a fresh
// one costs its page faults every batch. Page-locked batches come from
// LibTorch's caching host allocator instead, which also knows when a copy to
// the device from one is done.
struct ImageDataset::BatchPool {
  static constexpr size_t kMostKept = 16;
  std::mutex mutex;
  std::vector<torch::Tensor> kept;

  torch::Tensor take(torch::IntArrayRef sizes, torch::Dtype dtype) {
    std::lock_guard<std::mutex> lock(mutex);
    for (auto& tensor : kept) {
      // Held by the pool alone: no batch, view or copy of one is alive.
      if (tensor.use_count() == 1 && tensor.storage().use_count() == 1 && tensor.sizes() == sizes &&
          tensor.scalar_type() == dtype) {
        return tensor;
      }
    }
    auto tensor = torch::empty(sizes, torch::TensorOptions().dtype(dtype));
    if (kept.size() < kMostKept) {
      kept.push_back(tensor);
    } else {  // replace one that is free, if any, so that the pool follows a new shape
      for (auto& old : kept) {
        if (old.use_count() == 1 && old.storage().use_count() == 1) {
          old = tensor;
          break;
        }
      }
    }
    return tensor;
  }
};

struct ImageDataset::Folder {
  std::string root;
  std::vector<std::string> classes;
  std::vector<std::pair<std::filesystem::path, int64_t>> files;  // and their class
};

ImageDataset::ImageDataset(ImagePipeline pipeline, ShardOptions options)
    : pipeline_(std::move(pipeline)), options_(options), pool_(std::make_shared<BatchPool>()) {}

ImageDataset::ImageDataset(const std::string& spec, ImagePipeline pipeline, ShardOptions options)
    : ImageDataset(std::move(pipeline), options) {
  // The shards' per-sample transform is the pipeline, run here a batch at a time.
  shards_ = std::make_shared<ShardDataset>(
      spec,
      [](const Sample&) -> torch::data::Example<> {
        throw std::logic_error("an ImageDataset's shards are read by the ImageDataset");
      },
      options);
}

ImageDataset ImageDataset::folder(const std::string& root, ImagePipeline pipeline,
                                  ShardOptions options) {
  namespace fs = std::filesystem;
  auto folder = std::make_shared<Folder>();
  folder->root = root;
  std::error_code error;
  if (!fs::is_directory(root, error)) {
    throw ShardError("ImageDataset::folder: " + root + " is not a directory");
  }
  std::vector<fs::path> classes;
  for (const auto& entry : fs::directory_iterator(root)) {
    if (entry.is_directory()) classes.push_back(entry.path());
  }
  std::sort(classes.begin(), classes.end());
  std::vector<std::string> empty;
  for (const auto& dir : classes) {
    std::vector<fs::path> files;
    for (const auto& entry :
         fs::recursive_directory_iterator(dir, fs::directory_options::follow_directory_symlink)) {
      if (!entry.is_regular_file()) continue;
      const auto extension = lower_extension(entry.path());
      if (extension == "jpg" || extension == "jpeg" || extension == "png") {
        files.push_back(entry.path());
      }
    }
    // Every folder is a class, as torchvision's find_classes makes them: one
    // left out would shift the labels of those after it.
    const auto label = static_cast<int64_t>(folder->classes.size());
    folder->classes.push_back(dir.filename().string());
    if (files.empty()) empty.push_back(dir.filename().string());
    std::sort(files.begin(), files.end());
    for (auto& file : files) folder->files.emplace_back(std::move(file), label);
  }
  if (classes.empty()) throw ShardError("ImageDataset::folder: " + root + " holds no folder");
  if (!empty.empty()) {
    std::string names;
    for (const auto& name : empty) names += (names.empty() ? "" : ", ") + name;
    throw ShardError("ImageDataset::folder: no .jpg, .jpeg or .png file in the class folder" +
                     std::string(empty.size() > 1 ? "s " : " ") + names + " of " + root +
                     " (every folder is a class: remove it or add its images)");
  }
  ImageDataset dataset(std::move(pipeline), options);
  dataset.folder_ = std::move(folder);
  return dataset;
}

c10::optional<size_t> ImageDataset::size() const {
  return shards_ ? shards_->size() : c10::optional<size_t>(folder_->files.size());
}

std::vector<uint64_t> ImageDataset::counts() const {
  if (shards_) return shards_->reader().counts();
  return {static_cast<uint64_t>(folder_->files.size())};
}

ShardOptions ImageDataset::sampler_options() const {
  if (shards_) return ShardOptions(options_).shuffle_buffer(shards_->shuffle_buffer());
  // Files are read one by one: a chunk of one, the epoch's whole permutation.
  return ShardOptions(options_).chunk_samples(1);
}

void ImageDataset::read_ahead(const std::vector<size_t>& samples) const {
  if (shards_) shards_->read_ahead(samples);
}

std::string ImageDataset::where(size_t index) const {
  if (!shards_) return "file " + folder_->files.at(index).first.string();
  const auto [shard, local] = shards_->reader().locate(index);
  return "shard " + shards_->reader().shards()[shard] + ", sample " + std::to_string(local);
}

Sample ImageDataset::sample(size_t index) const {
  if (shards_) return shards_->sample(index);
  if (index >= folder_->files.size()) {
    throw std::out_of_range("ImageDataset: sample " + std::to_string(index) + " of " +
                            std::to_string(folder_->files.size()));
  }
  const auto& [path, label] = folder_->files[index];
  auto owned = std::make_shared<FileSample>();
  std::ifstream in(path, std::ios::binary);
  owned->bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  if (!in.good() && !in.eof()) throw ShardError("file " + path.string() + ": cannot be read");
  owned->label = std::to_string(label);
  Sample sample;
  sample.key = path.stem().string();
  sample.fields = {{lower_extension(path), owned->bytes}, {"cls", owned->label}};
  sample.data = std::move(owned);
  return sample;
}

torch::data::Example<> ImageDataset::get_batch(c10::ArrayRef<size_t> indices) {
  thread_local Image image;
  torch::Tensor data;
  std::vector<torch::Tensor> targets;
  targets.reserve(indices.size());
  std::string first_error;
  for (size_t index : indices) {
    try {
      const Sample sample = this->sample(index);  // names the shard and sample itself
      try {
        SampleRandom random(pipeline_.seed(), epoch_, index);
        bool flip = false;
        pipeline_.apply(sample, random, image, flip);
        if (!data.defined()) {
          // The batch, allocated once the first image tells its size.
          const std::vector<int64_t> sizes = {static_cast<int64_t>(indices.size()), 3, image.height,
                                              image.width};
          const auto dtype = pipeline_.normalizes() ? torch::kFloat : torch::kByte;
          data = pin_ ? torch::empty(sizes, torch::TensorOptions().dtype(dtype).pinned_memory(true))
                      : pool_->take(sizes, dtype);
        }
        pipeline_.collate(image, flip, data[static_cast<int64_t>(targets.size())]);
        targets.push_back(pipeline_.target_of(sample));
      } catch (const std::exception& error) {
        throw ImageError(where(index) + " (" + sample.key + "): " + error.what());
      }
    } catch (const std::exception& error) {
      if (!options_.skip_bad_samples()) throw;
      if (first_error.empty()) first_error = error.what();
      shards::note_skipped(*skipped_, "train::ImageDataset", error.what());
    }
  }
  // One huge photograph should not keep its buffer for the rest of the run.
  constexpr size_t kKeptBytes = size_t{64} << 20;
  if (image.pixels.capacity() > kKeptBytes) image = Image();
  if (targets.empty()) {
    if (indices.empty()) return {};
    throw ShardError("every sample of a batch failed; the first: " + first_error);
  }
  return {data.narrow(0, 0, static_cast<int64_t>(targets.size())), torch::stack(targets)};
}

size_t ImageDataset::default_workers(c10::Device device, size_t cores) {
  cores = std::max<size_t>(cores, 1);
  if (device.is_cuda()) return std::max<size_t>(cores - 1, 1);
  return std::max<size_t>(cores / 8, 1);
}

DataLoader<ImageDataset, ShardSampler> prepare_data_loader(ImageDataset dataset,
                                                           const LoaderOptions& options) {
  const auto ctx = get_context();
  // This worker's cores: the intra-op threads trainrun set (--cpus-per-worker),
  // as they were before any loader took some for its own.
  static const size_t cores = static_cast<size_t>(std::max(at::get_num_threads(), 1));
  auto sampler = detail::shard_sampler(dataset.counts(), dataset.sampler_options(), options);
  sampler.on_block(
      [reader = dataset](const std::vector<size_t>& samples) { reader.read_ahead(samples); });
  LoaderOptions chosen = options;
  // The first image loader decides the intra-op threads, once: a validation
  // loader made later does not cut them again.
  static std::atomic<bool> first{true};
  const bool decides = first.exchange(false);
  if (!options.workers()) {
    const size_t workers = ImageDataset::default_workers(ctx.device(), cores);
    chosen.workers(workers);
    // On a GPU the step's host side needs a thread: the rest decode.
    if (decides && ctx.device().is_cuda()) {
      at::set_num_threads(static_cast<int>(std::max<size_t>(cores - std::min(workers, cores), 1)));
    }
  }
  if (decides && ctx.world_rank() == 0) {
    const size_t workers = *chosen.workers();
    std::cerr << "train::ImageDataset: " << workers << " loader thread"
              << (workers == 1 ? " makes" : "s make") << " batches of " << chosen.batch_size()
              << " (" << std::max<size_t>(chosen.prefetch().value_or(2 * workers), 1)
              << " ahead), beside " << at::get_num_threads() << " LibTorch intra-op thread"
              << (at::get_num_threads() == 1 ? "" : "s") << ", of " << cores << " core"
              << (cores == 1 ? "" : "s") << " per worker"
              << (ctx.device().is_cuda() ? ""
                                         : " (on the CPU the step's compute outweighs "
                                           "decoding: its threads keep every core)")
              << std::endl;
  }
  return DataLoader<ImageDataset, ShardSampler>(std::move(dataset), std::move(sampler), chosen,
                                                ctx.device());
}

}  // namespace train
