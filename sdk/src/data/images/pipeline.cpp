// ImagePipeline: the steps as data, run per sample on a loader thread.
//
// Crops and resizes are not made one by one: each moves a window over the
// pixels the image comes from (and a mirror flag for flips before them), and
// the window is resampled once, when a step of the user's needs pixels or the
// steps end. When nothing was decoded yet, that one resample is the fused
// decode of the window (decode_resized).

#include <train/images.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <vector>

#include "data/decode/decoders.h"

namespace train {

enum class StepKind { kRandomResizedCrop, kResize, kCenterCrop, kFlip, kUser };

struct StepSpec {
  explicit StepSpec(StepKind kind) : kind(kind) {}
  StepKind kind;
  int size = 0;
  std::pair<double, double> scale{}, ratio{};
  double p = 0;
  ImagePipeline::Step user;
};

struct ImagePipeline::Steps {
  std::vector<StepSpec> steps;
  Decoder decoder;
  std::string field;
  Target target;
  bool fused = true;
  bool normalize = false;
  std::array<float, 3> mean{}, std{};
  uint64_t seed = 0;
};

namespace {

// Where the image so far lies in the pixels it is made from: a window of them
// resampled to height x width, mirrored or not.
struct Geometry {
  Window window;
  int height = 0, width = 0;
  bool mirrored = false;

  static Geometry whole(int height, int width) {
    return {{0, 0, static_cast<double>(height), static_cast<double>(width)}, height, width, false};
  }
  bool identity(int source_height, int source_width) const {
    return window.top == 0 && window.left == 0 && window.height == source_height &&
           window.width == source_width && height == source_height && width == source_width;
  }
  bool inside(int source_height, int source_width) const {
    constexpr double kRounding = 1e-6;  // a crop composed onto a resize, at an edge
    return window.top >= -kRounding && window.left >= -kRounding &&
           window.top + window.height <= source_height + kRounding &&
           window.left + window.width <= source_width + kRounding;
  }
  // A crop of the image so far, in its pixels.
  void crop(double top, double left, int crop_height, int crop_width) {
    const double sy = window.height / height, sx = window.width / width;
    if (mirrored) left = width - left - crop_width;
    window = {window.top + top * sy, window.left + left * sx, crop_height * sy, crop_width * sx};
    height = crop_height;
    width = crop_width;
  }
};

int python_round(double value) { return static_cast<int>(std::nearbyint(value)); }

void mirror_rows(Image& image) {
  for (int y = 0; y < image.height; ++y) {
    auto* row = image.row(y);
    for (int a = 0, b = image.width - 1; a < b; ++a, --b) {
      for (int c = 0; c < Image::kChannels; ++c) std::swap(row[a * 3 + c], row[b * 3 + c]);
    }
  }
}

// `geometry` of `source` into `out` (not mirrored), zeros where the window
// is outside it (a centre crop larger than the image).
void render(const Image& source, const Geometry& geometry, Image& out) {
  if (geometry.identity(source.height, source.width)) {
    out = source;
    return;
  }
  if (geometry.inside(source.height, source.width)) {
    return resize_image(source, geometry.window, geometry.height, geometry.width, out);
  }
  const auto& w = geometry.window;
  const double top = std::max(w.top, 0.0), left = std::max(w.left, 0.0);
  const double bottom = std::min(w.top + w.height, static_cast<double>(source.height));
  const double right = std::min(w.left + w.width, static_cast<double>(source.width));
  out.resize(geometry.height, geometry.width);
  std::fill(out.pixels.begin(), out.pixels.end(), uint8_t{0});
  const double fy = geometry.height / w.height, fx = geometry.width / w.width;
  const int y0 = python_round((top - w.top) * fy), y1 = python_round((bottom - w.top) * fy);
  const int x0 = python_round((left - w.left) * fx), x1 = python_round((right - w.left) * fx);
  if (bottom <= top || right <= left || y1 <= y0 || x1 <= x0) return;
  thread_local Image inner;
  resize_image(source, {top, left, bottom - top, right - left}, y1 - y0, x1 - x0, inner);
  for (int y = y0; y < y1; ++y) {
    std::memcpy(out.row(y) + x0 * 3, inner.row(y - y0), static_cast<size_t>(x1 - x0) * 3);
  }
}

std::string_view image_field(const Sample& sample, const std::string& field) {
  if (!field.empty()) return sample.at(field);
  for (const char* name : {"jpg", "jpeg", "png"}) {
    if (const auto* bytes = sample.find(name)) return *bytes;
  }
  return sample.at("jpg");  // throws, naming the fields the sample has
}

void check_size(int size, const char* step) {
  if (size < 1) {
    throw std::invalid_argument(std::string("train::ImagePipeline: ") + step +
                                " needs a size of at least 1, got " + std::to_string(size));
  }
}

}  // namespace

ImagePipeline::ImagePipeline() : steps_(std::make_shared<Steps>()) {}
ImagePipeline::~ImagePipeline() = default;
ImagePipeline::ImagePipeline(const ImagePipeline&) = default;
ImagePipeline& ImagePipeline::operator=(const ImagePipeline&) = default;

ImagePipeline::Steps& ImagePipeline::edit() {
  if (steps_.use_count() > 1) steps_ = std::make_shared<Steps>(*steps_);
  return *steps_;
}

ImagePipeline& ImagePipeline::random_resized_crop(int size, std::pair<double, double> scale,
                                                  std::pair<double, double> ratio) {
  check_size(size, "random_resized_crop");
  for (const auto& range : {scale, ratio}) {
    if (!(range.first >= 1e-6) || !(range.first <= range.second) || !(range.second <= 1e6)) {
      throw std::invalid_argument(
          "train::ImagePipeline: random_resized_crop's scale and ratio must be ranges in order "
          "(low <= high) within [1e-6, 1e6]");
    }
  }
  StepSpec step(StepKind::kRandomResizedCrop);
  step.size = size;
  step.scale = scale;
  step.ratio = ratio;
  edit().steps.push_back(std::move(step));
  return *this;
}

ImagePipeline& ImagePipeline::resize(int size) {
  check_size(size, "resize");
  StepSpec step(StepKind::kResize);
  step.size = size;
  edit().steps.push_back(std::move(step));
  return *this;
}

ImagePipeline& ImagePipeline::center_crop(int size) {
  check_size(size, "center_crop");
  StepSpec step(StepKind::kCenterCrop);
  step.size = size;
  edit().steps.push_back(std::move(step));
  return *this;
}

ImagePipeline& ImagePipeline::horizontal_flip(double p) {
  if (!(p >= 0 && p <= 1)) {
    throw std::invalid_argument("train::ImagePipeline: horizontal_flip's p must be in [0, 1]");
  }
  StepSpec step(StepKind::kFlip);
  step.p = p;
  edit().steps.push_back(std::move(step));
  return *this;
}

ImagePipeline& ImagePipeline::normalize(std::array<float, 3> mean, std::array<float, 3> std) {
  for (float s : std) {
    if (!(s > 0) || !std::isfinite(s)) {
      throw std::invalid_argument("train::ImagePipeline: normalize's std must be positive");
    }
  }
  auto& steps = edit();
  steps.normalize = true;
  steps.mean = mean;
  steps.std = std;
  return *this;
}

ImagePipeline& ImagePipeline::step(Step step) {
  if (!step) throw std::invalid_argument("train::ImagePipeline: an empty step");
  StepSpec spec(StepKind::kUser);
  spec.user = std::move(step);
  edit().steps.push_back(std::move(spec));
  return *this;
}

ImagePipeline& ImagePipeline::decoder(Decoder decoder) {
  edit().decoder = std::move(decoder);
  return *this;
}

ImagePipeline& ImagePipeline::field(std::string name) {
  edit().field = std::move(name);
  return *this;
}

ImagePipeline& ImagePipeline::target(Target target) {
  edit().target = std::move(target);
  return *this;
}

ImagePipeline& ImagePipeline::fused(bool fused) {
  edit().fused = fused;
  return *this;
}

ImagePipeline& ImagePipeline::seed(uint64_t seed) {
  edit().seed = seed;
  return *this;
}

bool ImagePipeline::normalizes() const { return steps_->normalize; }
uint64_t ImagePipeline::seed() const { return steps_->seed; }

namespace {

// A thread's working images, one set per pipeline running on it: a step or
// decoder of the user's may run another pipeline (or this one) itself.
struct Buffers {
  Image current, made, source;
};
thread_local std::vector<std::unique_ptr<Buffers>> buffers_by_depth;
thread_local size_t depth = 0;

struct Nested {
  Nested() {
    if (buffers_by_depth.size() <= depth) buffers_by_depth.push_back(std::make_unique<Buffers>());
    buffers = buffers_by_depth[depth++].get();
  }
  ~Nested() { --depth; }
  Buffers* buffers;
};

}  // namespace

void ImagePipeline::apply(const Sample& sample, ImageRandom& random, Image& out, bool& flip) const {
  const Steps& steps = *steps_;
  const Nested nested;
  Image& current = nested.buffers->current;  // the pixels the geometry is over, once decoded
  std::string_view bytes;
  ImageSize size;  // of the encoded image
  bool decoded = false;
  Geometry geometry;
  if (steps.decoder) {
    steps.decoder(sample, current);
    if (current.height < 1 || current.width < 1 ||
        current.pixels.size() != static_cast<size_t>(current.height) * current.width * 3) {
      throw ImageError("the decoder made no image (" + std::to_string(current.width) + "x" +
                       std::to_string(current.height) + ", " +
                       std::to_string(current.pixels.size()) + " bytes)");
    }
    decoded = true;
    geometry = Geometry::whole(current.height, current.width);
  } else {
    bytes = image_field(sample, steps.field);
    size = image_size(bytes);
    geometry = Geometry::whole(size.height, size.width);
  }
  // The pixels of the geometry so far, not mirrored, in `into`.
  const auto materialize = [&](Image& into) {
    if (decoded) return render(current, geometry, into);
    Image& source = nested.buffers->source;
    if (steps.fused && decode::is_jpeg(bytes)) {
      if (geometry.identity(size.height, size.width)) return decode_image(bytes, into);
      if (geometry.inside(size.height, size.width)) {
        return decode_resized(bytes, geometry.window, geometry.height, geometry.width, into);
      }
    }
    decode_image(bytes, source);
    render(source, geometry, into);
  };
  for (const auto& step : steps.steps) {
    switch (step.kind) {
      case StepKind::kRandomResizedCrop: {
        const auto crop = random_resized_crop_params(geometry.height, geometry.width, step.scale,
                                                     step.ratio, random);
        geometry.crop(crop.top, crop.left, static_cast<int>(crop.height),
                      static_cast<int>(crop.width));
        // ... resized to size x size.
        geometry.height = geometry.width = step.size;
        break;
      }
      case StepKind::kResize: {
        const bool portrait = geometry.width <= geometry.height;
        const int shorter = portrait ? geometry.width : geometry.height;
        const int longer = portrait ? geometry.height : geometry.width;
        const int resized = static_cast<int>(static_cast<int64_t>(step.size) * longer / shorter);
        geometry.height = portrait ? resized : step.size;
        geometry.width = portrait ? step.size : resized;
        break;
      }
      case StepKind::kCenterCrop: {
        const int c = step.size;
        // torchvision pads a smaller image with zeros, then takes the centre.
        const double top = c > geometry.height ? -((c - geometry.height) / 2)
                                               : python_round((geometry.height - c) / 2.0);
        const double left = c > geometry.width ? -((c - geometry.width) / 2)
                                               : python_round((geometry.width - c) / 2.0);
        geometry.crop(top, left, c, c);
        break;
      }
      case StepKind::kFlip:
        if (random.uniform(0.0f, 1.0f) < step.p) geometry.mirrored = !geometry.mirrored;
        break;
      case StepKind::kUser: {
        Image& made = nested.buffers->made;
        materialize(made);
        if (geometry.mirrored) mirror_rows(made);
        std::swap(current, made);
        decoded = true;
        step.user(current, random);
        if (current.height < 1 || current.width < 1 ||
            current.pixels.size() != static_cast<size_t>(current.height) * current.width * 3) {
          throw ImageError("a step left no image (" + std::to_string(current.width) + "x" +
                           std::to_string(current.height) + ", " +
                           std::to_string(current.pixels.size()) + " bytes)");
        }
        geometry = Geometry::whole(current.height, current.width);
        break;
      }
    }
  }
  materialize(out);
  flip = geometry.mirrored;
}

torch::Tensor ImagePipeline::target_of(const Sample& sample) const {
  if (steps_->target) return steps_->target(sample);
  return torch::tensor(class_label(sample.at("cls")), torch::kLong);
}

void ImagePipeline::collate(const Image& image, bool flip, torch::Tensor slot) const {
  if (slot.dim() != 3 || slot.size(0) != 3 || slot.size(1) != image.height ||
      slot.size(2) != image.width || !slot.is_contiguous()) {
    throw ImageError("an image of " + std::to_string(image.width) + "x" +
                     std::to_string(image.height) + " does not fit its batch's " +
                     std::to_string(slot.size(-1)) + "x" + std::to_string(slot.size(-2)) +
                     " (end the pipeline with a crop to one size)");
  }
  const size_t plane = static_cast<size_t>(image.height) * image.width;
  const int width = image.width;
  if (!steps_->normalize) {
    auto* out = slot.data_ptr<uint8_t>();
    for (int y = 0; y < image.height; ++y) {
      const uint8_t* row = image.row(y);
      uint8_t* r = out + static_cast<size_t>(y) * width;
      uint8_t* g = r + plane;
      uint8_t* b = g + plane;
      for (int x = 0; x < width; ++x) {
        const uint8_t* p = row + 3 * (flip ? width - 1 - x : x);
        r[x] = p[0];
        g[x] = p[1];
        b[x] = p[2];
      }
    }
    return;
  }
  float scale[3], bias[3];  // (v / 255 - mean) / std = v * scale + bias
  for (int c = 0; c < 3; ++c) {
    scale[c] = 1.0f / (255.0f * steps_->std[c]);
    bias[c] = -steps_->mean[c] / steps_->std[c];
  }
  auto* out = slot.data_ptr<float>();
  for (int y = 0; y < image.height; ++y) {
    const uint8_t* row = image.row(y);
    float* r = out + static_cast<size_t>(y) * width;
    float* g = r + plane;
    float* b = g + plane;
    for (int x = 0; x < width; ++x) {
      const uint8_t* p = row + 3 * (flip ? width - 1 - x : x);
      r[x] = p[0] * scale[0] + bias[0];
      g[x] = p[1] * scale[1] + bias[1];
      b[x] = p[2] * scale[2] + bias[2];
    }
  }
}

torch::Tensor normalize_images(const torch::Tensor& batch, std::array<float, 3> mean,
                               std::array<float, 3> std) {
  if (batch.dim() != 4 || batch.size(1) != 3) {
    throw std::invalid_argument("train::normalize_images: a batch [N, 3, H, W], got " +
                                std::to_string(batch.dim()) + " dimensions");
  }
  // Scalars per channel: no mean or std tensor copied to the device, which
  // would make the host wait for it (and cannot be captured in a graph).
  auto out = batch.to(torch::kFloat);
  for (int64_t c = 0; c < 3; ++c) {
    out.select(1, c).sub_(255.0 * mean[c]).div_(255.0 * std[c]);
  }
  return out;
}

}  // namespace train
