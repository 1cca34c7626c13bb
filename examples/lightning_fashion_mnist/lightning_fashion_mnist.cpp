// Ray Train's PyTorch Lightning FashionMNIST classifier (ResNet-18, Adam 1e-3,
// cross-entropy, batch 128 per worker) as a train::LightningModule: the loop,
// validation across ranks, reports, checkpoints and resuming are the
// Trainer's. Config: epochs (2), max_steps (-1: all), train_batches (-1:
// all, per epoch), precision (32 or bf16), patience (0: no early stopping),
// val_batches (-1: all), batch_size (128), log_every (50: the loss printed
// every n steps), capture (false; true: each step captured as a CUDA graph
// and replayed, on a GPU), data_dir.

#include <train/train.h>

#include <torch/torch.h>

#include "fashion_mnist_dataset.h"
#include "resnet.h"

namespace {

struct ImageClassifier : train::LightningModule {
  fashion_mnist::ResNet18 model{register_module("model", fashion_mnist::ResNet18(10))};

  torch::Tensor training_step(train::Batch& batch, int64_t) override {
    auto loss = torch::nn::functional::cross_entropy(model->forward(batch.data), batch.target);
    log("loss", loss, train::LogOptions().on_step(true).on_epoch(true).prog_bar(true));
    return loss;
  }

  void validation_step(train::Batch& batch, int64_t) override {
    auto output = model->forward(batch.data);
    log("val_loss", torch::nn::functional::cross_entropy(output, batch.target));
    log("accuracy", output.argmax(1).eq(batch.target).to(torch::kFloat).mean());
  }

  train::OptimizerConfig configure_optimizers() override {
    return {std::make_shared<train::optim::Adam>(parameters(), train::optim::AdamOptions(1e-3))};
  }
};

}  // namespace

void train_func(const train::Config& config) {
  const auto data_dir = config.get("data_dir", fashion_mnist::kDefaultDataDir);
  const auto batch_size = static_cast<size_t>(config.get<int>("batch_size", 128));
  const bool capture = config.get<bool>("capture", false);
  std::vector<std::shared_ptr<train::Callback>> callbacks;
  if (int patience = config.get<int>("patience", 0); patience > 0) {
    callbacks.push_back(std::make_shared<train::EarlyStopping>(
        train::EarlyStoppingOptions().monitor("val_loss").patience(patience)));
  }
  train::Trainer trainer(
      train::TrainerOptions()
          .max_epochs(config.get<int>("epochs", 2))
          .max_steps(config.get<int>("max_steps", -1))
          .limit_train_batches(config.get<int>("train_batches", -1))
          .limit_val_batches(config.get<int>("val_batches", -1))
          .log_every_n_steps(config.get<int>("log_every", 50))
          .precision(train::precision_from_string(config.get("precision", "32")))
          .train_loader(train::LoaderOptions()
                            .batch_size(batch_size)
                            .drop_last(capture))  // a captured step replays batches of one shape
          .val_loader(train::LoaderOptions().batch_size(batch_size))
          .capture(train::CaptureOptions().enabled(capture)),
      callbacks);
  // Normalised once, then gathered a batch at a time.
  auto tensors = [&](fashion_mnist::Split split) {
    fashion_mnist::FashionMNIST raw(data_dir, split);
    return train::TensorDataset(raw.normalized_images(), raw.labels());
  };
  trainer.fit(std::make_shared<ImageClassifier>(), tensors(fashion_mnist::Split::kTrain),
              tensors(fashion_mnist::Split::kTest));
}

TRAIN_FUNC(train_func);
