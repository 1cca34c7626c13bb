#pragma once

#include <torch/data/datasets/base.h>
#include <torch/data/example.h>
#include <torch/types.h>

#include <string>

namespace fashion_mnist {

/// Where Debian's dataset-fashion-mnist package puts the files.
constexpr const char* kDefaultDataDir = "/usr/share/datasets/fashion-mnist";
/// Mean and standard deviation of the training images (pixels scaled to [0, 1]).
constexpr double kMean = 0.28604;
constexpr double kStd = 0.32025;

enum class Split { kTrain, kTest };

/// FashionMNIST as a LibTorch dataset: 1x28x28 float images, normalised, and
/// int64 labels 0-9. Reads the idx files (train-images-idx3-ubyte, ...) from
/// `dir`, gzip-compressed (.gz) or not. Images stay in memory as bytes and are
/// normalised per example. Copies share the data.
class FashionMNIST : public torch::data::datasets::Dataset<FashionMNIST> {
 public:
  /// Throws std::runtime_error naming the path (and the Debian package) when a
  /// file is missing, and naming the file when it is not a valid idx file.
  FashionMNIST(const std::string& dir, Split split);

  torch::data::Example<> get(size_t index) override;
  c10::optional<size_t> size() const override { return static_cast<size_t>(labels_.size(0)); }

  const torch::Tensor& images() const { return images_; }  // N x 28 x 28, uint8
  /// Every image as get() makes it, at once: N x 1 x 28 x 28, float, normalised.
  torch::Tensor normalized_images() const;
  const torch::Tensor& labels() const { return labels_; }  // N, int64

 private:
  torch::Tensor images_;
  torch::Tensor labels_;
};

/// Reads one idx file (gzip or raw) into a tensor of its dimensions, uint8.
/// `magic` is 2051 for images, 2049 for labels.
torch::Tensor read_idx(const std::string& path, uint32_t magic);

}  // namespace fashion_mnist
