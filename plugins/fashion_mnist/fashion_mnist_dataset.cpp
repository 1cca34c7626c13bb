#include "fashion_mnist_dataset.h"

#include <zlib.h>

#include <filesystem>
#include <memory>
#include <stdexcept>
#include <vector>

namespace fashion_mnist {
namespace {

using GzFile = std::unique_ptr<gzFile_s, decltype(&gzclose)>;

uint32_t read_be32(gzFile file, const std::string& path) {
  unsigned char bytes[4];
  if (gzread(file, bytes, 4) != 4) throw std::runtime_error(path + " is truncated");
  return (uint32_t{bytes[0]} << 24) | (uint32_t{bytes[1]} << 16) | (uint32_t{bytes[2]} << 8) |
         uint32_t{bytes[3]};
}

// "dir/name.gz" if it exists, else "dir/name".
std::string locate(const std::string& dir, const std::string& name) {
  auto gz = std::filesystem::path(dir) / (name + ".gz");
  auto raw = std::filesystem::path(dir) / name;
  if (std::filesystem::exists(gz)) return gz.string();
  if (std::filesystem::exists(raw)) return raw.string();
  throw std::runtime_error("FashionMNIST file " + gz.string() + " (or " + name +
                           ") not found: install the Debian package dataset-fashion-mnist "
                           "or set data_dir");
}

}  // namespace

torch::Tensor read_idx(const std::string& path, uint32_t magic) {
  GzFile file(gzopen(path.c_str(), "rb"), &gzclose);  // reads raw files as they are
  if (!file) throw std::runtime_error("cannot open " + path);
  uint32_t found = read_be32(file.get(), path);
  if (found != magic) {
    throw std::runtime_error(path + " is not an idx file of the expected kind (magic " +
                             std::to_string(found) + ", expected " + std::to_string(magic) + ")");
  }
  std::vector<int64_t> dims{read_be32(file.get(), path)};
  for (uint32_t i = 1; i < (magic & 0xff); ++i) dims.push_back(read_be32(file.get(), path));
  auto tensor = torch::empty(dims, torch::kUInt8);
  auto bytes = static_cast<size_t>(tensor.numel());
  for (size_t done = 0; done < bytes;) {
    auto chunk = static_cast<unsigned>(std::min<size_t>(bytes - done, 1u << 30));
    int n = gzread(file.get(), tensor.data_ptr<uint8_t>() + done, chunk);
    if (n <= 0) throw std::runtime_error(path + " is truncated");
    done += static_cast<size_t>(n);
  }
  return tensor;
}

FashionMNIST::FashionMNIST(const std::string& dir, Split split) {
  std::string prefix = split == Split::kTrain ? "train" : "t10k";
  images_ = read_idx(locate(dir, prefix + "-images-idx3-ubyte"), 2051);
  labels_ = read_idx(locate(dir, prefix + "-labels-idx1-ubyte"), 2049).to(torch::kInt64);
  if (images_.size(0) != labels_.size(0)) {
    throw std::runtime_error("FashionMNIST in " + dir + " has " + std::to_string(images_.size(0)) +
                             " images but " + std::to_string(labels_.size(0)) + " labels");
  }
}

torch::data::Example<> FashionMNIST::get(size_t index) {
  auto image = images_[static_cast<int64_t>(index)].to(torch::kFloat32).div_(255.0);
  image.sub_(kMean).div_(kStd);
  return {image.unsqueeze(0), labels_[static_cast<int64_t>(index)]};
}

torch::Tensor FashionMNIST::normalized_images() const {
  // The operations of get(), in its order, on the whole set.
  auto images = images_.to(torch::kFloat32).div_(255.0);
  images.sub_(kMean).div_(kStd);
  return images.unsqueeze(1);
}

}  // namespace fashion_mnist
