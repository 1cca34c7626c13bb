// The ImageNet example (examples/imagenet: ResNet-50, torchvision's recipe)
// in real runs on pictures: from an ImageFolder and from its shards, with a
// validation folder, on 2 workers.

#include <cmath>
#include <fstream>

#include "doctest_torch.h"
#include "image_files.h"
#include "run_helpers.h"

namespace {

namespace fs = std::filesystem;

// Two classes that any crop tells apart (pictures darkened, and lightened),
// `per_class` images of each, a few as PNG.
void write_folder(const fs::path& root, int per_class, uint32_t seed) {
  for (int cls = 0; cls < 2; ++cls) {
    const auto dir = root / (cls == 0 ? "dark" : "light");
    fs::create_directories(dir);
    for (int i = 0; i < per_class; ++i) {
      auto image = test_images::picture(40 + i % 3 * 4, 48, seed + static_cast<uint32_t>(i));
      for (auto& v : image.pixels) v = static_cast<uint8_t>(cls == 0 ? v / 3 : 255 - (255 - v) / 3);
      const bool png = i % 4 == 3;
      std::ofstream(dir / ("img" + std::to_string(i) + (png ? ".png" : ".jpg")), std::ios::binary)
          << (png ? test_images::encode_png(image) : test_images::encode_jpeg(image));
    }
  }
}

// The loss of each epoch (its training steps' mean), in order.
std::vector<double> epoch_losses(const fs::path& run_dir) {
  std::vector<double> losses;
  for (const auto& report : read_reports(run_dir / "result.jsonl")) {
    if (report["metrics"].contains("loss_epoch")) {
      losses.push_back(report["metrics"]["loss_epoch"].get<double>());
    }
  }
  return losses;
}

}  // namespace

TEST_CASE(
    "the ImageNet example trains ResNet-50 from an ImageFolder and from its shards, and its "
    "loss falls") {
  Sandbox box;
  const auto train_dir = box.root() / "train";
  const auto val_dir = box.root() / "val";
  write_folder(train_dir, 16, 1);
  write_folder(val_dir, 4, 100);
  fs::create_directories(box.root() / "shards");
  const auto pack = std::string(TRAINRUN_EXE) + " pack '" + train_dir.string() + "' '" +
                    (box.root() / "shards" / "train-%06d.tar").string() +
                    "' --shard-samples 8 > /dev/null";
  REQUIRE(std::system(pack.c_str()) == 0);
  const auto shards = (box.root() / "shards" / "train-{000000..000003}.tar").string();
  const auto run_of = [&](const std::string& name, const std::string& data,
                          const std::string& more) {
    return box.run(std::string("--plugin '") + IMAGENET_PLUGIN + "' --name " + name +
                   " --config data='" + data + "' --config val_data='" + val_dir.string() +
                   "' --config classes=2 --config image_size=32 --config log_every=100 " + more);
  };
  {
    // One worker, batches of 16: what small batches leave of batch norm's
    // statistics is noisy enough on 2 workers of 8 to hide the fall.
    auto run = run_of("folder", train_dir.string(),
                      "-n 1 --cpus-per-worker 2 --config batch_size=16 --config epochs=8 "
                      "--config lr=0.002");
    INFO(run.output);
    REQUIRE(run.exit_code == 0);
    CHECK(run.output.find("train::ImageDataset: 1 loader thread") != std::string::npos);
    const auto losses = epoch_losses(box.run_dir("folder"));
    for (double loss : losses) MESSAGE("epoch loss " << loss);
    REQUIRE(losses.size() == 8);
    CHECK((losses[6] + losses[7]) < 0.6 * (losses[0] + losses[1]));
  }
  {
    // Its shards, on 2 workers: each trains and validates its part.
    auto run = run_of("shards", shards,
                      "-n 2 --cpus-per-worker 1 --config batch_size=8 "
                      "--config epochs=2 --config lr=0.002");
    INFO(run.output);
    REQUIRE(run.exit_code == 0);
    const auto reports = read_reports(box.run_dir("shards") / "result.jsonl");
    REQUIRE(reports.size() == 2);
    for (const auto& report : reports) {
      CHECK(std::isfinite(report["metrics"]["loss_epoch"].get<double>()));
      CHECK(report["metrics"].contains("val_accuracy"));
    }
  }
}
