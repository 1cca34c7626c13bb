// Packs FashionMNIST into WebDataset shards with train::ShardWriter: each
// image a sample with its pixels as an .npy array (28x28 uint8) and its label
// as .cls, 10,000 to a shard, each shard with its index. The plugin trains
// from them with --config shards=DIR/train-{0000..0005}.tar.
//
//   fashion_mnist_pack OUT_DIR [--data-dir /usr/share/datasets/fashion-mnist]
//       [--split train|test] [--sorted]
// --sorted writes them in label order (all the 0s, then the 1s...), the order
// that a poor shuffle shows.

#include <train/shards.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <numeric>

#include "fashion_mnist_dataset.h"

int main(int argc, char** argv) {
  std::string out, data_dir = fashion_mnist::kDefaultDataDir, split = "train";
  bool sorted = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--data-dir" && i + 1 < argc) {
      data_dir = argv[++i];
    } else if (arg == "--split" && i + 1 < argc) {
      split = argv[++i];
    } else if (arg == "--sorted") {
      sorted = true;
    } else if (out.empty() && arg.rfind("--", 0) != 0) {
      out = arg;
    } else {
      std::cerr << "usage: fashion_mnist_pack OUT_DIR [--data-dir DIR] [--split train|test] "
                   "[--sorted]\n";
      return 2;
    }
  }
  if (out.empty() || (split != "train" && split != "test")) {
    std::cerr << "usage: fashion_mnist_pack OUT_DIR [--data-dir DIR] [--split train|test] "
                 "[--sorted]\n";
    return 2;
  }
  try {
    const fashion_mnist::FashionMNIST data(
        data_dir, split == "train" ? fashion_mnist::Split::kTrain : fashion_mnist::Split::kTest);
    std::filesystem::create_directories(out);
    train::ShardWriterOptions options;
    options.max_samples = 10000;
    train::ShardWriter writer(out + "/" + split + "-%04d.tar", options);
    const auto labels = data.labels();
    std::vector<int64_t> order(static_cast<size_t>(labels.size(0)));
    std::iota(order.begin(), order.end(), 0);
    if (sorted) {
      std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
        return labels[a].item<int64_t>() < labels[b].item<int64_t>();
      });
    }
    for (int64_t i : order) {
      char key[16];
      std::snprintf(key, sizeof(key), "%05lld", static_cast<long long>(i));
      writer.write(key, {{"npy", train::npy_bytes(data.images()[i])},
                         {"cls", std::to_string(labels[i].item<int64_t>())}});
    }
    const auto shards = writer.close();
    std::cout << "packed " << order.size() << " images into " << shards.size() << " shards: "
              << shards.front() << " .. " << shards.back() << "\n";
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "fashion_mnist_pack: " << e.what() << "\n";
    return 1;
  }
}
