// Images through trainrun's loader, and the decode ceiling, for
// tools/bench/ingest.py (docs/benchmarks.md, "Images").
//
//   ingest_bench trainrun --shards SPEC [--batch 256] [--threads 2] [--images N]
//       [--size 224] [--uint8] [--unfused]
//       RandomResizedCrop(size, scale=(0.08, 1)), a flip and ImageNet's
//       normalisation (or uint8 batches) by the loader's threads, in rank 0 of
//       1's order, for N images (default: one epoch).
//   ingest_bench ceiling --shards SPEC [--images N]
//       libjpeg-turbo's whole decode of the same images on this thread, no
//       augmentation (the samples read into memory first, not timed).
// Each prints one JSON line: images, seconds (from the first request),
// loop_cpu_s (the CPU seconds of every thread since then) and first_batch_s
// (the loader's).

#include <train/images.h>

#include <torch/torch.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <sys/resource.h>

#include <chrono>
#include <iostream>

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// CPU seconds of this process so far, every thread's.
double cpu_seconds() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) +
         static_cast<double>(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) * 1e-6;
}

struct Setup {
  std::string shards;
  size_t batch = 256, threads = 2, images = 0;
  int size = 224;
  bool uint8 = false, unfused = false;
};

nlohmann::json run_loader(const Setup& setup) {
  const auto start = Clock::now();
  const double cpu_start = cpu_seconds();
  auto steps = train::ImagePipeline().random_resized_crop(setup.size).horizontal_flip();
  if (!setup.uint8) steps.normalize();
  if (setup.unfused) steps.fused(false);
  train::ImageDataset data(setup.shards, steps);
  const train::Context ctx(0, 0, 0, 1, 1, torch::kCPU, "bench", "/nonexistent");
  train::ShardSampler sampler(data.counts(), ctx, true, true, 0, data.sampler_options());
  sampler.on_block(
      [reader = data](const std::vector<size_t>& samples) { reader.read_ahead(samples); });
  const size_t images = setup.images > 0 ? setup.images : data.size().value();
  train::DataLoader<train::ImageDataset, train::ShardSampler> loader(
      std::move(data), std::move(sampler),
      train::LoaderOptions().batch_size(setup.batch).workers(setup.threads).progress(false),
      torch::kCPU);
  size_t seen = 0;
  double first = -1;
  int64_t checksum = 0;
  for (size_t epoch = 0; seen < images; ++epoch) {
    loader.set_epoch(epoch);
    for (auto& batch : loader) {
      if (first < 0) first = seconds_since(start);
      seen += static_cast<size_t>(batch.data.size(0));
      checksum += batch.target.sum().item<int64_t>();
      if (seen >= images) break;
    }
  }
  return {{"images", seen},
          {"seconds", seconds_since(start)},
          {"first_batch_s", first},
          {"loop_cpu_s", cpu_seconds() - cpu_start},
          {"checksum", checksum}};
}

nlohmann::json run_ceiling(const Setup& setup) {
  train::ShardReader reader(setup.shards);
  const size_t images = setup.images > 0 ? std::min<size_t>(setup.images, reader.size())
                                         : static_cast<size_t>(reader.size());
  std::vector<train::Sample> samples;
  for (size_t i = 0; i < images; ++i) samples.push_back(reader.read(i));
  train::Image image;
  uint64_t pixels = 0;
  const auto start = Clock::now();
  const double cpu_start = cpu_seconds();
  for (const auto& sample : samples) {
    train::decode_image(sample.at("jpg"), image);
    pixels += image.pixels.size();
  }
  return {{"images", images},
          {"seconds", seconds_since(start)},
          {"first_batch_s", 0},
          {"loop_cpu_s", cpu_seconds() - cpu_start},
          {"bytes", pixels}};
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("trainrun's image loader against the decode ceiling");
  app.require_subcommand(1);
  Setup setup;
  auto* loader = app.add_subcommand("trainrun", "the loader's pipeline");
  auto* ceiling = app.add_subcommand("ceiling", "whole decodes on one thread");
  for (auto* command : {loader, ceiling}) {
    command->add_option("--shards", setup.shards, "the shards (expand_shards' spec)")->required();
    command->add_option("--images", setup.images, "images to make (default: an epoch)");
  }
  loader->add_option("--batch", setup.batch);
  loader->add_option("--threads", setup.threads);
  loader->add_option("--size", setup.size);
  loader->add_flag("--uint8", setup.uint8, "uint8 batches, normalised on the device");
  loader->add_flag("--unfused", setup.unfused, "decode whole, then crop and resize");
  CLI11_PARSE(app, argc, argv);
  try {
    const auto result = loader->parsed() ? run_loader(setup) : run_ceiling(setup);
    std::cout << result.dump() << std::endl;
  } catch (const std::exception& error) {
    std::cerr << "ingest_bench: " << error.what() << std::endl;
    return 1;
  }
  return 0;
}
