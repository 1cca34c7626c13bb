// Which samples a sharded run trained, counted by the model itself: one weight
// per sample, and each optimizer step adds 1 to the weight of every sample in
// every rank's batch (loss -sum(w[ids]), DDP's mean of the gradients, SGD with
// the world size as learning rate). The final model is how many times each
// sample was trained, counting only the steps that count: the steps a failure
// undid are undone in it too, as they are in any model.
//
// Entries: `fit`, train::Trainer over a train::ShardDataset; `loop`, a loop of
// its own that saves the loader's position with each checkpoint and loads it
// (DataLoader::save, load).
// Config: shards (the spec), samples (how many the shards hold), epochs (2),
// batch (10 per rank), checkpoint_steps (6), workers (2 loader threads),
// shuffle_buffer (50), chunk (8), fail_step and marker (rank fail_rank, 1,
// kills itself with SIGKILL after that step, once: the marker says it did),
// step_sleep_ms (0), cache_kb (the chunk cache, 262144), cache_dir (none),
// await_file and await_step (every rank waits at that step until the file exists, 60 s at most). Rank 0 prints
// "trained min=A max=B sum=C" at the end, and per epoch how many samples were
// trained 0, 1 and 1.5 times.

#include <train/train.h>

#include <torch/torch.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <thread>

namespace {

train::ShardDataset shards(const train::Config& config) {
  return train::ShardDataset(
      config.get("shards", ""),
      [](const train::Sample& sample) {
        const auto id = train::class_label(sample.at("id"));
        return torch::data::Example<>(torch::tensor({id}), torch::tensor(train::class_label(sample.at("cls"))));
      },
      train::ShardOptions()
          .chunk_samples(static_cast<uint64_t>(config.get<int>("chunk", 8)))
          .shuffle_buffer(static_cast<uint64_t>(config.get<int>("shuffle_buffer", 50)))
          .cache_bytes(static_cast<uint64_t>(config.get<int>("cache_kb", 262144)) << 10)
          .cache_dir(config.get("cache_dir", "")));
}

train::LoaderOptions loader_options(const train::Config& config) {
  return train::LoaderOptions()
      .batch_size(static_cast<size_t>(config.get<int>("batch", 10)))
      .workers(static_cast<size_t>(config.get<int>("workers", 2)))
      .seed(static_cast<uint64_t>(config.get<int>("seed", 1)));
}

// `w`: the counts; with `by_epoch`, `epochs` rows of them, one per epoch.
void print_counts(const torch::Tensor& w, int64_t epochs = 0) {
  if (train::get_context().world_rank() != 0) return;
  const auto total = epochs > 0 ? w.reshape({epochs, -1}).sum(0) : w;
  std::cout << "trained min=" << total.min().item<double>() << " max=" << total.max().item<double>()
            << " sum=" << total.sum().item<double>() << std::endl;
  // Per epoch, how many samples were trained 0, 1 and 1.5 times (a step of 2
  // ranks after a third was lost counts 3/2: DDP's mean over 2, SGD's rate of 3).
  for (int64_t e = 0; e < epochs; ++e) {
    const auto row = w.reshape({epochs, -1})[e];
    const auto zeros = row.eq(0).sum().item<int64_t>(), ones = row.eq(1).sum().item<int64_t>();
    const auto halves = row.eq(1.5).sum().item<int64_t>();
    std::cout << "epoch " << e << " zeros=" << zeros << " ones=" << ones << " halves=" << halves
              << " other=" << row.numel() - zeros - ones - halves << std::endl;
  }
}

void maybe_fail(const train::Config& config, int64_t step) {
  const auto marker = config.get("marker", "");
  if (marker.empty() || step != config.get<int>("fail_step", -1) ||
      train::get_context().world_rank() != config.get<int>("fail_rank", 1) ||
      std::filesystem::exists(marker)) {
    return;
  }
  std::ofstream(marker) << "failed\n";
  std::cout << "failing after step " << step << std::endl;
  std::raise(SIGKILL);
}

// One weight per sample and epoch.
class Counter : public train::LightningModule {
 public:
  Counter(int64_t samples, int64_t epochs) : samples(samples), epochs(epochs) {
    w = register_parameter("w", torch::zeros({samples * epochs}));
  }
  torch::Tensor training_step(train::Batch& batch, int64_t) override {
    // The rate is this world's size, also after a checkpoint of another
    // size put its own back with the optimizer's state.
    for (auto& group : optimizer->param_groups()) {
      group.options().set_lr(train::get_context().world_size());
    }
    return -w.index_select(0, batch.data.squeeze(1) + current_epoch() * samples).sum();
  }
  train::OptimizerConfig configure_optimizers() override {
    const double world = train::get_context().world_size();
    optimizer = std::make_shared<torch::optim::SGD>(parameters(), torch::optim::SGDOptions(world));
    return {optimizer};
  }
  std::shared_ptr<torch::optim::SGD> optimizer;
  int64_t samples, epochs;
  torch::Tensor w;
};

class AfterStep : public train::Callback {
 public:
  explicit AfterStep(train::Config config) : config_(std::move(config)) {}
  std::string state_key() const override { return "AfterStep"; }
  void on_train_batch_end(train::Trainer& trainer, train::LightningModule&, const train::Batch&,
                          int64_t) override {
    if (const int ms = config_.get<int>("step_sleep_ms", 0); ms > 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    }
    maybe_fail(config_, trainer.global_step());
    // Waits (60 s at most) at step await_step for the file await_file, which
    // the test makes once what it waits for has happened.
    const auto await = config_.get("await_file", "");
    if (!await.empty() && trainer.global_step() == config_.get<int>("await_step", -1)) {
      for (int i = 0; i < 600 && !std::filesystem::exists(await); ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
    }
  }
  void on_fit_end(train::Trainer&, train::LightningModule& module) override {
    auto& counter = static_cast<Counter&>(module);
    print_counts(counter.w.detach(), counter.epochs);
  }

 private:
  train::Config config_;
};

void fit(const train::Config& config) {
  auto module = std::make_shared<Counter>(config.get<int>("samples", 0), config.get<int>("epochs", 2));
  train::Trainer trainer(
      train::TrainerOptions()
          .max_epochs(config.get<int>("epochs", 2))
          .train_loader(loader_options(config))
          .log_every_n_steps(1000),
      {std::make_shared<train::ModelCheckpoint>(train::ModelCheckpointOptions().every_n_train_steps(
           config.get<int>("checkpoint_steps", 6))),
       std::make_shared<AfterStep>(config)});
  trainer.fit(module, shards(config));
}

struct Weights : torch::nn::Module {
  explicit Weights(int64_t samples) { w = register_parameter("w", torch::zeros({samples})); }
  torch::Tensor w;
};

void loop(const train::Config& config) {
  const auto ctx = train::get_context();
  auto model = std::make_shared<Weights>(config.get<int>("samples", 0));
  auto loader = train::prepare_data_loader(shards(config), loader_options(config));
  size_t first_epoch = 0;
  int64_t step = 0;
  if (auto checkpoint = train::get_checkpoint()) {
    torch::load(model, (checkpoint->path() / "model.pt").string());
    first_epoch = loader.load((checkpoint->path() / "loader.pt").string());
    std::ifstream(checkpoint->path() / "step") >> step;
    if (ctx.world_rank() == 0) {
      std::cout << "resuming at step " << step << ", epoch " << first_epoch << std::endl;
    }
  }
  model = train::prepare_model(model);
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(ctx.world_size()));
  const int64_t every = config.get<int>("checkpoint_steps", 6);
  for (size_t epoch : loader.epochs(first_epoch, static_cast<size_t>(config.get<int>("epochs", 2)))) {
    (void)epoch;
    for (auto& batch : loader) {
      optimizer.zero_grad();
      (-model->w.index_select(0, batch.data.squeeze(1)).sum()).backward();
      optimizer.step();
      ++step;
      maybe_fail(config, step);
      if (step % every == 0) {
        train::TempDir dir;
        if (ctx.world_rank() == 0) {
          torch::save(model, (dir.path() / "model.pt").string());
          loader.save((dir.path() / "loader.pt").string());
          std::ofstream(dir.path() / "step") << step;
        }
        train::report({{"step", step}}, train::Checkpoint::from_directory(dir.path()));
      }
    }
  }
  print_counts(model->w.detach());
}

}  // namespace

TRAIN_FUNC(fit);
TRAIN_FUNC(loop);
