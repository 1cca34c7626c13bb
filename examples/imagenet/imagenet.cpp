// ResNet-50 on ImageNet with torchvision's recipe (references/classification:
// SGD, momentum 0.9, weight decay 1e-4, lr 0.1 for a global batch of 256 and
// in proportion to it, divided by 10 every 30 epochs; RandomResizedCrop(224)
// and a flip for training, Resize(256) and CenterCrop(224) to validate), its
// images decoded on the loader's threads (train/images.h) as uint8 batches,
// normalised on the device. The same plugin runs on the CPU and on GPUs.
//
//   trainrun --plugin build/examples/imagenet/libimagenet.so --num-workers 2
//       --config data=/data/imagenet/train val_data=/data/imagenet/val max_steps=100
//
// Config: data (an ImageFolder directory, class folders of JPEG or PNG files,
// or shards: trainrun pack's or WebDataset's, a spec such as
// "/data/shards/train-{000000..000639}.tar" or s3://...), val_data (the same,
// optional), synthetic (0; N: N random images held in memory instead of data,
// the loader's baseline), epochs (90), batch_size (32 per worker), lr (0.1 x
// global batch / 256), momentum (0.9), weight_decay (1e-4), lr_step (30
// epochs), max_steps (-1: all), train_batches / val_batches (-1: all, per
// epoch), image_size (224; validation resizes to image_size x 8 / 7),
// classes (1000), loader_threads (the loader's default: cores less one on a
// GPU, one in eight on the CPU), warmup (5 steps before samples_per_s is
// timed), log_every (50), seed (0: the initial weights'; the augmentations'
// are the pipeline's, from the epoch and the sample).

#include <train/images.h>
#include <train/train.h>

#include <torch/torch.h>

#include <chrono>
#include <filesystem>
#include <iostream>

#include "resnet50.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Classifier : train::LightningModule {
  Classifier(int64_t classes, double lr, double momentum, double weight_decay, int64_t lr_step,
             int64_t warmup)
      : lr(lr), momentum(momentum), weight_decay(weight_decay), lr_step(lr_step), warmup(warmup) {
    model = register_module("model", imagenet::ResNet50(classes));
  }

  torch::Tensor training_step(train::Batch& batch, int64_t batch_idx) override {
    time_step(batch_idx, batch.data.size(0));
    auto output = model->forward(images(batch.data));
    auto loss = torch::nn::functional::cross_entropy(output, batch.target);
    log("loss", loss, train::LogOptions().on_step(true).on_epoch(true).prog_bar(true));
    log("accuracy", output.argmax(1).eq(batch.target).to(torch::kFloat).mean(),
        train::LogOptions().on_step(false).on_epoch(true));
    return loss;
  }

  void validation_step(train::Batch& batch, int64_t) override {
    auto output = model->forward(images(batch.data));
    log("val_loss", torch::nn::functional::cross_entropy(output, batch.target));
    log("val_accuracy", output.argmax(1).eq(batch.target).to(torch::kFloat).mean());
  }

  void on_train_epoch_end() override {
    if (timed_steps > 0) {
      const double seconds = std::chrono::duration<double>(last - first).count();
      log("samples_per_s", seconds > 0 ? static_cast<double>(timed_samples) / seconds : 0.0);
    }
    timed_steps = 0;
  }

  train::OptimizerConfig configure_optimizers() override {
    auto sgd = std::make_shared<train::optim::SGD>(
        parameters(), train::optim::SGDOptions(lr).momentum(momentum).weight_decay(weight_decay));
    return {sgd, std::make_shared<torch::optim::StepLR>(*sgd, lr_step, 0.1)};
  }

  // Batches of the loader are uint8, normalised here on the device; the
  // synthetic ones too.
  static torch::Tensor images(const torch::Tensor& data) {
    return data.scalar_type() == torch::kByte ? train::normalize_images(data) : data;
  }

  // Samples per second from the start of step `warmup` of the epoch to the
  // start of its last step.
  void time_step(int64_t batch_idx, int64_t samples) {
    const auto now = Clock::now();
    if (batch_idx < warmup) return;
    if (timed_steps++ == 0) {
      first = now;
      timed_samples = 0;
    } else {
      timed_samples += pending;
    }
    pending = samples;
    last = now;
  }

  imagenet::ResNet50 model{nullptr};
  double lr, momentum, weight_decay;
  int64_t lr_step, warmup;
  int64_t timed_steps = 0, timed_samples = 0, pending = 0;
  Clock::time_point first, last;
};

// An ImageFolder directory, or shards.
train::ImageDataset images_of(const std::string& where, const train::ImagePipeline& steps) {
  if (std::filesystem::is_directory(where)) return train::ImageDataset::folder(where, steps);
  return train::ImageDataset(where, steps);
}

// `count` random uint8 images and labels, the same on every rank.
train::TensorDataset synthetic(int64_t count, int64_t size, int64_t classes) {
  auto generator = at::detail::createCPUGenerator(0);
  auto data = torch::randint(0, 256, {count, 3, size, size}, generator, torch::kByte);
  auto target = torch::randint(0, classes, {count}, generator, torch::kLong);
  return train::TensorDataset(data, target);
}

}  // namespace

void train_func(const train::Config& config) {
  const auto ctx = train::get_context();
  const auto batch_size = static_cast<size_t>(config.get<int>("batch_size", 32));
  const int64_t classes = config.get<int>("classes", 1000);
  const int size = config.get<int>("image_size", 224);
  const double global = static_cast<double>(batch_size) * ctx.world_size();
  c10::optional<size_t> threads;
  if (int t = config.get<int>("loader_threads", 0); t > 0) threads = static_cast<size_t>(t);
  train::Trainer trainer(
      train::TrainerOptions()
          .max_epochs(config.get<int>("epochs", 90))
          .max_steps(config.get<int>("max_steps", -1))
          .limit_train_batches(config.get<int>("train_batches", -1))
          .limit_val_batches(config.get<int>("val_batches", -1))
          .log_every_n_steps(config.get<int>("log_every", 50))
          .train_loader(train::LoaderOptions().batch_size(batch_size).workers(threads))
          .val_loader(train::LoaderOptions().batch_size(batch_size).workers(threads)));
  torch::manual_seed(static_cast<uint64_t>(config.get<int>("seed", 0)));  // the initial weights
  auto module = std::make_shared<Classifier>(
      classes, config.get<double>("lr", 0.1 * global / 256), config.get<double>("momentum", 0.9),
      config.get<double>("weight_decay", 1e-4), config.get<int>("lr_step", 30),
      config.get<int>("warmup", 5));
  if (const int count = config.get<int>("synthetic", 0); count > 0) {
    if (ctx.world_rank() == 0) {
      std::cout << "imagenet: " << count << " synthetic images in memory, batch " << batch_size
                << " x " << ctx.world_size() << " workers" << std::endl;
    }
    return trainer.fit(module, synthetic(count, size, classes));
  }
  const auto data = config.get("data", std::string());
  if (data.empty()) {
    throw std::invalid_argument(
        "config data: an ImageFolder directory or shards (or synthetic=N) is needed");
  }
  auto train_set =
      images_of(data, train::ImagePipeline().random_resized_crop(size).horizontal_flip());
  if (ctx.world_rank() == 0) {
    std::cout << "imagenet: " << *train_set.size() << " training images from " << data << ", batch "
              << batch_size << " x " << ctx.world_size() << " workers, lr "
              << config.get<double>("lr", 0.1 * global / 256) << std::endl;
  }
  const auto val_data = config.get("val_data", std::string());
  if (val_data.empty()) return trainer.fit(module, std::move(train_set));
  // Resize(256), CenterCrop(224): the resize is 8/7 of the crop.
  auto val_set = images_of(val_data, train::ImagePipeline().resize(size * 8 / 7).center_crop(size));
  trainer.fit(module, std::move(train_set), std::move(val_set));
}

TRAIN_FUNC(train_func);
