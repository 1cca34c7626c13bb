#pragma once

// Images at the speed of the CPU: JPEG and PNG samples decoded, cropped,
// resized, flipped and normalised on the loader's threads, each written
// straight into its place in the batch (page-locked for a CUDA device)
// (docs/data.md, "Images"). Link trainrun::images.
//
//   auto train_set = train::ImageDataset("data/train-{000000..000099}.tar",
//       train::ImagePipeline().random_resized_crop(224).horizontal_flip().normalize());
//   auto loader = train::prepare_data_loader(std::move(train_set), options);
//
// A pipeline is immutable once a dataset holds it and runs on several loader
// threads at once; a step of your own must be safe to call so (it may run a
// pipeline itself).

#include <train/data.h>
#include <train/shard_files.h>
#include <train/shards.h>

#include <torch/data.h>

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace train {

/// An image that cannot be decoded (not a JPEG or PNG, corrupt, truncated,
/// too large), or a pipeline step given what it cannot take.
class ImageError : public ShardError {
 public:
  using ShardError::ShardError;
};

/// An 8-bit RGB image in rows (height x width x 3 bytes, HWC). Buffers are
/// reused: a step that makes a new image writes into another Image.
struct Image {
  int height = 0;
  int width = 0;
  std::vector<uint8_t> pixels;

  static constexpr int kChannels = 3;
  /// Sizes the pixels for height x width (kept bytes are not cleared).
  void resize(int new_height, int new_width);
  uint8_t* row(int y) { return pixels.data() + static_cast<size_t>(y) * width * kChannels; }
  const uint8_t* row(int y) const {
    return pixels.data() + static_cast<size_t>(y) * width * kChannels;
  }
};

/// An image's height and width, read from its header alone. Throws ImageError
/// for bytes that are neither a JPEG nor a PNG.
struct ImageSize {
  int height = 0;
  int width = 0;
};
ImageSize image_size(std::string_view bytes);

/// Decodes a JPEG or PNG (any of their colour types; grey, palette and CMYK
/// are converted, alpha dropped, as PIL's convert("RGB")) into `out`. Throws
/// ImageError, saying what was wrong, for anything it cannot decode whole;
/// images over 2^28 pixels are refused rather than allocated.
void decode_image(std::string_view bytes, Image& out);

/// A region of an image, in its pixels (fractions allowed: a resize followed by
/// a crop names part of a pixel).
struct Window {
  double top = 0;
  double left = 0;
  double height = 0;
  double width = 0;
};

/// The `window` of an image resized to height x width: shrunk by averaging
/// each output pixel's area, enlarged bilinearly (OpenCV's imgproc, on this
/// thread). Throws ImageError for an empty window or one outside the image.
void resize_image(const Image& in, const Window& window, int height, int width, Image& out);

/// decode_image, then resize_image of `window`, in one: a JPEG decodes only
/// the rows and columns of blocks the window covers, at the smallest DCT scale
/// (1/8 to 8/8) that keeps the window at least height x width
/// (libjpeg-turbo's partial and scaled decode); a PNG decodes whole.
void decode_resized(std::string_view bytes, const Window& window, int height, int width,
                    Image& out);

/// The random numbers a random step draws. Each sample's are its own: drawn
/// from (the pipeline's seed, the epoch, the sample's index), so that a batch
/// comes out the same whichever thread makes it, and a resumed run draws what
/// the first would have.
class ImageRandom {
 public:
  virtual ~ImageRandom() = default;
  /// A number in [low, high), as torch.empty(1).uniform_(low, high).item().
  virtual float uniform(float low, float high) = 0;
  /// An integer in [low, high), as torch.randint(low, high, (1,)).item().
  virtual int64_t integer(int64_t low, int64_t high) = 0;
};

/// torchvision's RandomResizedCrop.get_params: the crop (top, left, height,
/// width) of a height x width image, the same as torchvision's for the same
/// random numbers (ten tries at an area in `scale` and a log-uniform aspect in
/// `ratio`, then the centre crop). Throws ImageError for an empty image or
/// ranges that are reversed or not positive.
Window random_resized_crop_params(int height, int width, std::pair<double, double> scale,
                                  std::pair<double, double> ratio, ImageRandom& random);

/// ImageNet's channel means and standard deviations (torchvision's recipe).
inline constexpr std::array<float, 3> kImageNetMean = {0.485f, 0.456f, 0.406f};
inline constexpr std::array<float, 3> kImageNetStd = {0.229f, 0.224f, 0.225f};

/// The steps that turn a sample into an image of the batch, as torchvision's
/// transforms.Compose writes them, on the loader's threads:
///
///   ImagePipeline().random_resized_crop(224).horizontal_flip().normalize()  // training
///   ImagePipeline().resize(256).center_crop(224).normalize()                // evaluation
///
/// The image comes from the sample's first "jpg", "jpeg" or "png" field (or
/// field()), the target from its "cls" (or target()). Crops and resizes in a
/// row are one resample of the window they name; when the first of them
/// follows the built-in decoder, a JPEG decodes only that window, scaled
/// (decode_resized; fused(false): whole, then cropped and resized). A flip and
/// the normalisation are made as the image is written into the batch.
/// Without normalize() batches are uint8 (0..255): the cheaper copy to a
/// GPU, normalised there with normalize_images().
class ImagePipeline {
 public:
  /// Your own decoder: the sample's image into the Image (for another format,
  /// or another field). Replaces the built-in one, which no crop is fused into.
  using Decoder = std::function<void(const Sample& sample, Image& out)>;
  /// Your own step on the image so far (it may change its size); `random` is
  /// the sample's.
  using Step = std::function<void(Image& image, ImageRandom& random)>;
  /// The sample's target, a tensor of the same shape for every sample.
  using Target = std::function<torch::Tensor(const Sample& sample)>;

  /// torchvision's RandomResizedCrop(size, scale, ratio): a random window of
  /// the image, resized to size x size. Throws std::invalid_argument for a
  /// size under 1 or ranges that are reversed or not positive.
  ImagePipeline& random_resized_crop(int size, std::pair<double, double> scale = {0.08, 1.0},
                                     std::pair<double, double> ratio = {3.0 / 4.0, 4.0 / 3.0});
  /// torchvision's Resize(size): the shorter side to `size`, the longer in
  /// proportion (rounded down).
  ImagePipeline& resize(int size);
  /// torchvision's CenterCrop(size): the centre size x size; an image smaller
  /// than that is padded with zeros, as torchvision pads it.
  ImagePipeline& center_crop(int size);
  /// torchvision's RandomHorizontalFlip(p).
  ImagePipeline& horizontal_flip(double p = 0.5);
  /// ToTensor then Normalize(mean, std): float32 batches of
  /// (pixel / 255 - mean) / std.
  ImagePipeline& normalize(std::array<float, 3> mean = kImageNetMean,
                           std::array<float, 3> std = kImageNetStd);
  /// Your own step, after the steps before it.
  ImagePipeline& step(Step step);
  /// Your own decoder (see Decoder).
  ImagePipeline& decoder(Decoder decoder);
  /// The field the built-in decoder reads ("jpg", "png", "left.jpg").
  ImagePipeline& field(std::string name);
  /// The target (default: the "cls" field's integer, class_label, as int64).
  ImagePipeline& target(Target target);
  /// Whether a JPEG's crop is decoded alone and scaled (default: true).
  ImagePipeline& fused(bool fused);
  /// The seed of every sample's random numbers (with the epoch and the index).
  ImagePipeline& seed(uint64_t seed);

  /// Runs the steps on one sample with `random`: the image in `out`, and
  /// whether the batch is to take it flipped. What Collate writes. Throws
  /// what a step throws.
  void apply(const Sample& sample, ImageRandom& random, Image& out, bool& flip) const;
  /// The sample's target.
  torch::Tensor target_of(const Sample& sample) const;
  /// Writes `image` (flipped) into `slot`, a [3, H, W] tensor of the batch:
  /// uint8, or float32 normalised. Throws ImageError when the sizes differ.
  void collate(const Image& image, bool flip, torch::Tensor slot) const;
  /// Whether batches are float32 (normalize()) rather than uint8.
  bool normalizes() const;
  uint64_t seed() const;

  ImagePipeline();
  ~ImagePipeline();
  ImagePipeline(const ImagePipeline&);
  ImagePipeline& operator=(const ImagePipeline&);

 private:
  struct Steps;
  std::shared_ptr<Steps> steps_;  // copied on write: datasets share it
  Steps& edit();
};

/// uint8 image batches [N, 3, H, W] as float32 (x / 255 - mean) / std, on
/// their device, with nothing copied from the host (no wait for the device;
/// it can be captured in a CUDA graph): normalize() done on a GPU after the
/// cheaper copy. Throws std::invalid_argument for another shape.
torch::Tensor normalize_images(const torch::Tensor& batch,
                               std::array<float, 3> mean = kImageNetMean,
                               std::array<float, 3> std = kImageNetStd);

/// Images of sharded samples (a ShardDataset's shards and options), or of a
/// folder of class folders (torchvision's ImageFolder), made into batches by
/// an ImagePipeline on the loader's threads: each batch's tensors are
/// allocated once and every image written into its place, page-locked when
/// the loader feeds a CUDA device. Copies share the samples.
class ImageDataset
    : public torch::data::datasets::BatchDataset<ImageDataset, torch::data::Example<>,
                                                 c10::ArrayRef<size_t>> {
 public:
  /// The shards of `spec` (expand_shards'), read as ShardDataset reads them.
  /// Throws what ShardDataset's constructor throws.
  ImageDataset(const std::string& spec, ImagePipeline pipeline, ShardOptions options = {});
  /// An ImageFolder, as torchvision's finds its classes: every folder in
  /// `root` is a class, labelled by its place in name order, and its .jpg,
  /// .jpeg and .png files (in its subfolders too) its samples, in name order
  /// (read whole; a sample's field is its extension, lower-cased, and "cls"
  /// its label). Throws ShardError, naming them, when a class has no image
  /// (torchvision's ImageFolder refuses it too: a class left out would shift
  /// every later label), or `root` has no class.
  static ImageDataset folder(const std::string& root, ImagePipeline pipeline,
                             ShardOptions options = {});

  /// The images of `indices`, made by the pipeline, as one batch. Throws
  /// ShardError naming the shard (or file) and the sample when one cannot be
  /// read or made; with ShardOptions::skip_bad_samples it is left out and
  /// counted instead.
  torch::data::Example<> get_batch(c10::ArrayRef<size_t> indices) override;
  c10::optional<size_t> size() const override;

  /// The epoch whose random numbers the next batches draw (the loader sets it).
  void set_epoch(size_t epoch) { epoch_ = epoch; }
  /// Whether batches are made in page-locked memory (the loader sets it for a
  /// CUDA device).
  void pin_memory(bool pin) { pin_ = pin; }
  /// Threads to make batches when LoaderOptions::workers is not given, sized
  /// from this worker's cores (--cpus-per-worker, LibTorch's intra-op
  /// threads): on a CUDA device all but one, the step keeping one; on the CPU
  /// one in eight (at least one), as the step's own compute outweighs
  /// decoding there.
  static size_t default_workers(c10::Device device, size_t cores);

  const ImagePipeline& pipeline() const { return pipeline_; }
  /// The shards (for a folder: none).
  const ShardDataset* shards() const { return shards_.get(); }
  /// Samples per shard (for a folder, one of every file), and the options to
  /// read them with, for the loader's ShardSampler.
  std::vector<uint64_t> counts() const;
  ShardOptions sampler_options() const;
  /// Starts reading `samples` ahead (see ShardDataset::read_ahead).
  void read_ahead(const std::vector<size_t>& samples) const;
  /// Samples skipped so far (skip_bad_samples), by every copy.
  uint64_t skipped() const { return skipped_->load(); }

 private:
  struct Folder;
  struct BatchPool;
  ImageDataset(ImagePipeline pipeline, ShardOptions options);
  Sample sample(size_t index) const;
  std::string where(size_t index) const;

  ImagePipeline pipeline_;
  ShardOptions options_;
  std::shared_ptr<ShardDataset> shards_;  // or
  std::shared_ptr<const Folder> folder_;
  std::shared_ptr<BatchPool> pool_;  // the batches' tensors, used again
  size_t epoch_ = 0;
  bool pin_ = false;
  std::shared_ptr<std::atomic<uint64_t>> skipped_ = std::make_shared<std::atomic<uint64_t>>(0);
};

/// prepare_data_loader for images: each rank reads its part through a
/// ShardSampler (a folder as one shard of single-file chunks), with
/// LoaderOptions::workers defaulting to ImageDataset::default_workers. The
/// first image loader of the process, when its workers were not given and it
/// feeds a CUDA device, also cuts LibTorch's intra-op threads to the cores its
/// threads leave; rank 0 says so in one line. Checks, as for a ShardDataset,
/// that every rank has as many samples in each shard.
DataLoader<ImageDataset, ShardSampler> prepare_data_loader(ImageDataset dataset,
                                                           const LoaderOptions& options = {});

}  // namespace train
