#include <zlib.h>

#include <filesystem>
#include <fstream>

#include "fashion_mnist_dataset.h"
// After LibTorch: see doctest_torch.h.
#include "doctest_torch.h"
#include "temp_dir.h"

using fashion_mnist::FashionMNIST;
using fashion_mnist::Split;

namespace {

std::string be32(uint32_t v) {
  return {static_cast<char>(v >> 24), static_cast<char>(v >> 16), static_cast<char>(v >> 8),
          static_cast<char>(v)};
}

void write(const std::filesystem::path& path, const std::string& bytes, bool gzip) {
  if (gzip) {
    gzFile file = gzopen((path.string() + ".gz").c_str(), "wb");
    gzwrite(file, bytes.data(), static_cast<unsigned>(bytes.size()));
    gzclose(file);
  } else {
    std::ofstream(path, std::ios::binary) << bytes;
  }
}

// Three 28x28 images whose pixels are all 0, 255 and 51, labelled 7, 0, 9.
void write_tiny_set(const std::filesystem::path& dir, bool gzip) {
  std::string images = be32(2051) + be32(3) + be32(28) + be32(28);
  for (unsigned char value : {0, 255, 51}) images += std::string(28 * 28, static_cast<char>(value));
  std::string labels = be32(2049) + be32(3) + std::string{7, 0, 9};
  write(dir / "t10k-images-idx3-ubyte", images, gzip);
  write(dir / "t10k-labels-idx1-ubyte", labels, gzip);
}

}  // namespace

TEST_CASE("FashionMNIST reads idx files, gzip-compressed or not, and normalises") {
  for (bool gzip : {true, false}) {
    CAPTURE(gzip);
    TempDir tmp;
    write_tiny_set(tmp.path, gzip);
    FashionMNIST data(tmp.path.string(), Split::kTest);
    REQUIRE(data.size().value() == 3);
    auto example = data.get(1);
    CHECK((example.data.sizes() == torch::IntArrayRef{1, 28, 28}));
    CHECK(example.target.item<int64_t>() == 0);
    CHECK(example.data[0][5][5].item<float>() ==
          doctest::Approx((1.0 - fashion_mnist::kMean) / fashion_mnist::kStd));
    CHECK(data.get(0).data.max().item<float>() ==
          doctest::Approx(-fashion_mnist::kMean / fashion_mnist::kStd));
    CHECK(data.get(2).target.item<int64_t>() == 9);
  }
}

TEST_CASE("FashionMNIST: missing and malformed files are clear errors") {
  TempDir tmp;
  CHECK_THROWS_WITH(FashionMNIST(tmp.path.string(), Split::kTrain),
                    doctest::Contains("install the Debian package dataset-fashion-mnist"));
  write_tiny_set(tmp.path, false);
  std::ofstream(tmp.path / "t10k-labels-idx1-ubyte", std::ios::binary) << be32(2051) << be32(3);
  CHECK_THROWS_WITH(FashionMNIST(tmp.path.string(), Split::kTest),
                    doctest::Contains("is not an idx file of the expected kind"));
}

TEST_CASE("FashionMNIST: the real dataset, when installed") {
  if (!std::filesystem::exists(fashion_mnist::kDefaultDataDir)) return;
  FashionMNIST train(fashion_mnist::kDefaultDataDir, Split::kTrain);
  FashionMNIST test(fashion_mnist::kDefaultDataDir, Split::kTest);
  CHECK(train.size().value() == 60000);
  CHECK(test.size().value() == 10000);
  CHECK(train.labels().min().item<int64_t>() == 0);
  CHECK(train.labels().max().item<int64_t>() == 9);
  double mean = train.images().to(torch::kFloat64).mean().item<double>() / 255.0;
  CHECK(mean == doctest::Approx(fashion_mnist::kMean).epsilon(0.001));
}

TEST_CASE("FashionMNIST: normalized_images is every get() at once") {
  if (!std::filesystem::exists(fashion_mnist::kDefaultDataDir)) return;
  FashionMNIST test(fashion_mnist::kDefaultDataDir, Split::kTest);
  auto all = test.normalized_images();
  CHECK(all.sizes() == torch::IntArrayRef{10000, 1, 28, 28});
  for (size_t i : {size_t{0}, size_t{1234}, size_t{9999}}) {
    CHECK(torch::equal(all[static_cast<int64_t>(i)], test.get(i).data));
  }
}
