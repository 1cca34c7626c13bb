// train::Trainer under test: a small model with dropout on a synthetic,
// seeded dataset, so that two runs compute the same losses and a resumed run
// can be compared with one that was not interrupted.
//
// Config: epochs (3), batches (8 per epoch, batch 4 per rank), report_steps
// (0: report every epoch only), checkpoint_steps (0: a checkpoint every
// epoch), accumulate (1), clip (0), precision ("32"), fail_step and marker
// (rank `fail_rank` (1) kills itself with SIGKILL after that optimizer step,
// once: the marker file says it did; with fail_in_validation, in epoch 0's
// validation instead), prog_bar_rank0 (only rank 0 logs the loss with
// prog_bar), val_every (0: validate at epoch ends only), mismatch (rank 1
// logs a name the others do not), monitor (ModelCheckpoint's, top 1, with
// checkpoint_steps), val_batches (-1: all), val_size (10 per rank), scores (a list "5,3,4" of the
// validation score per epoch, for ModelCheckpoint(monitor score, top 2) and
// EarlyStopping(patience)), patience (2), kill_in_backward (with marker: rank
// `fail_rank` dies inside the backward pass of step fail_step + 1, collectives
// in flight, instead of after step fail_step), catch_up_marker (with marker,
// once the marker exists: that rank, a replacement then, dies as it catches
// up, after the models' parameters came and before the Trainer's state),
// await_replacement (with marker: the replacement of rank fail_rank says it
// started in <marker>.replacement, and once the marker exists the lowest other rank waits
// for that, at most 60 s, before its next step: the replacement then joins
// with steps to spare), replacement_raises (with marker: that replacement
// throws as it builds its module, and the waiting rank waits until its
// process is gone), fail_rank2, fail_step2 and marker2 (a
// second rank killed after its step, once; with await_replacement its
// replacement is awaited the same way), step_sleep_ms (0), capture (false:
// TrainerOptions::capture), log_lr (true: the learning rate logged as a
// number), sdk_optim (false: torch::optim::Adam; true: train::optim::Adam),
// epoch_scheduler (false: StepLR steps every step), step_hook (false: a
// callback with its own on_before_optimizer_step), dropout (true).

#include <train/train.h>

#include <torch/torch.h>

#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <thread>

namespace {

constexpr int64_t kFeatures = 6;
constexpr int64_t kBatch = 4;

// y = a fixed linear map of x, plus noise: the same on every rank and run.
class Synthetic : public torch::data::datasets::Dataset<Synthetic> {
 public:
  explicit Synthetic(int64_t size) {
    auto generator = at::detail::createCPUGenerator(7);
    x_ = torch::randn({size, kFeatures}, generator);
    auto w = torch::linspace(-1, 1, kFeatures).unsqueeze(1);
    y_ = (x_.matmul(w).squeeze(1) > 0).to(torch::kLong);
  }
  torch::data::Example<> get(size_t index) override {
    return {x_[static_cast<int64_t>(index)], y_[static_cast<int64_t>(index)]};
  }
  c10::optional<size_t> size() const override { return static_cast<size_t>(x_.size(0)); }

 private:
  torch::Tensor x_, y_;
};

std::vector<double> numbers(const std::string& list) {
  std::vector<double> values;
  std::stringstream in(list);
  for (std::string item; std::getline(in, item, ',');) values.push_back(std::stod(item));
  return values;
}

struct Net : train::LightningModule {
  explicit Net(const train::Config& config)
      : mismatch(config.get<bool>("mismatch", false)),
        prog_bar_rank0(config.get<bool>("prog_bar_rank0", false)),
        scores(numbers(config.get("scores", ""))),
        marker(config.get<bool>("fail_in_validation", false) ? config.get("marker", "") : ""),
        fail_rank(config.get<int>("fail_rank", 1)),
        backward_marker(config.get<bool>("kill_in_backward", false) ? config.get("marker", "")
                                                                    : ""),
        fail_step(config.get<int>("fail_step", 5)),
        catch_up_marker(config.get("catch_up_marker", "")),
        first_marker(config.get("marker", "")),
        await_replacement(config.get<bool>("await_replacement", false)),
        step_sleep_ms(config.get<int>("step_sleep_ms", 0)),
        second_marker(config.get("marker2", "")),
        second_rank(config.get<int>("fail_rank2", -1)),
        replacement_raises(config.get<bool>("replacement_raises", false)),
        log_lr(config.get<bool>("log_lr", true)),
        sdk_optim(config.get<bool>("sdk_optim", false)),
        epoch_scheduler(config.get<bool>("epoch_scheduler", false)),
        use_dropout(config.get<bool>("dropout", true)) {
    const int rank = train::get_context().world_rank();
    for (const auto& [marker_file, failing] : awaited()) {
      if (await_replacement && rank == failing && std::filesystem::exists(marker_file) &&
          !std::filesystem::exists(marker_file + ".replacement")) {
        std::ofstream(marker_file + ".replacement") << ::getpid() << "\n";
      }
    }
    if (replacement_raises && failing_rank() && std::filesystem::exists(first_marker) &&
        !std::filesystem::exists(first_marker + ".raised")) {
      std::ofstream(first_marker + ".raised") << "raised\n";  // once
      throw std::runtime_error("the replacement cannot build its module");
    }
  }

  torch::nn::Linear hidden{register_module("hidden", torch::nn::Linear(kFeatures, 16))};
  torch::nn::Dropout dropout{register_module("dropout", torch::nn::Dropout(0.3))};
  torch::nn::Linear out{register_module("out", torch::nn::Linear(16, 2))};
  std::shared_ptr<torch::optim::Optimizer> optimizer;
  bool mismatch;
  bool prog_bar_rank0;
  std::vector<double> scores;
  std::string marker;  // kill in validation, once
  int fail_rank;
  std::string backward_marker;  // kill in backward, once
  int64_t fail_step;
  std::string catch_up_marker;  // kill the replacement as it catches up, once
  std::string first_marker;
  bool await_replacement;
  int step_sleep_ms;

  bool failing_rank() const { return train::get_context().world_rank() == fail_rank; }
  std::string second_marker;
  int second_rank;
  bool replacement_raises;
  bool log_lr;           // log the learning rate, a number from the host
  bool sdk_optim;        // train::optim::Adam rather than torch::optim::Adam
  bool epoch_scheduler;  // step the scheduler every epoch rather than every step
  bool use_dropout;      // false: no random numbers (a captured step draws others)
  // Each kill's marker, and the rank it kills.
  std::vector<std::pair<std::string, int>> awaited() const {
    std::vector<std::pair<std::string, int>> kills;
    if (!first_marker.empty()) kills.emplace_back(first_marker, fail_rank);
    if (!second_marker.empty()) kills.emplace_back(second_marker, second_rank);
    return kills;
  }

  torch::Tensor forward(const torch::Tensor& x) {
    auto h = torch::relu(hidden(x));
    return out(use_dropout ? dropout(h) : h);
  }

  torch::Tensor training_step(train::Batch& batch, int64_t) override {
    for (const auto& [marker_file, failing] : awaited()) {
      const int waiter = failing == 0 ? 1 : 0;  // the lowest other rank
      if (!await_replacement || train::get_context().world_rank() != waiter ||
          !std::filesystem::exists(marker_file)) {
        continue;
      }
      for (int i = 0; i < 6000 && !std::filesystem::exists(marker_file + ".replacement"); ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      // One that raises: until the controller reaped it, so that its
      // failure is dealt with before this rank's next step.
      int pid = 0;
      if (replacement_raises) std::ifstream(marker_file + ".replacement") >> pid;
      for (int i = 0;
           pid > 0 && i < 6000 && std::filesystem::exists("/proc/" + std::to_string(pid)); ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    }
    if (step_sleep_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(step_sleep_ms));
    auto loss = torch::nn::functional::cross_entropy(forward(batch.data), batch.target);
    if (!backward_marker.empty() && failing_rank() && global_step() == fail_step &&
        !std::filesystem::exists(backward_marker)) {
      std::ofstream(backward_marker) << "failed\n";
      std::cout << "failing in the backward pass of step " << fail_step + 1 << std::endl;
      // The first layer's gradient comes last: the later layer's bucket is
      // being averaged (or waits for this rank) when it dies.
      hidden->weight.register_hook([](const torch::Tensor& grad) {
        std::raise(SIGKILL);
        return grad;
      });
    }
    const bool prog_bar = !prog_bar_rank0 || train::get_context().world_rank() == 0;
    log("loss", loss, train::LogOptions().on_step(true).on_epoch(true).prog_bar(prog_bar));
    if (log_lr) {
      log("lr", optimizer->param_groups()[0].options().get_lr(),
          train::LogOptions().on_step(true).on_epoch(false));
    }
    if (mismatch && train::get_context().world_rank() == 1) {
      log("only_rank_1", 1.0, train::LogOptions().on_epoch(true));
    }
    return loss;
  }

  void validation_step(train::Batch& batch, int64_t) override {
    if (!marker.empty() && current_epoch() == 0 && train::get_context().world_rank() == fail_rank &&
        !std::filesystem::exists(marker)) {
      std::ofstream(marker) << "failed\n";
      std::cout << "failing in validation" << std::endl;
      std::raise(SIGKILL);
    }
    auto output = forward(batch.data);
    log("val_loss", torch::nn::functional::cross_entropy(output, batch.target));
    // The batch's size, averaged with batch sizes as weights: Σn²/Σn.
    log("batch_size", static_cast<double>(batch.data.size(0)));
    if (!scores.empty()) {
      const auto epoch = static_cast<size_t>(current_epoch());
      log("score", scores[std::min(epoch, scores.size() - 1)]);
    }
  }

  train::OptimizerConfig configure_optimizers() override {
    // A replacement comes here after prepare_model joined the group.
    if (!catch_up_marker.empty() && failing_rank() && std::filesystem::exists(first_marker) &&
        !std::filesystem::exists(catch_up_marker)) {
      std::ofstream(catch_up_marker) << "failed\n";
      std::cout << "failing while catching up" << std::endl;
      std::raise(SIGKILL);
    }
    if (sdk_optim) {
      optimizer =
          std::make_shared<train::optim::Adam>(parameters(), train::optim::AdamOptions(0.01));
    } else {
      optimizer =
          std::make_shared<torch::optim::Adam>(parameters(), torch::optim::AdamOptions(0.01));
    }
    return {optimizer,
            std::make_shared<torch::optim::StepLR>(*optimizer, /*step_size=*/3, /*gamma=*/0.5),
            epoch_scheduler ? train::SchedulerInterval::kEpoch : train::SchedulerInterval::kStep};
  }
};

// Kills this rank once, after optimizer step `step`.
class FailOnce : public train::Callback {
 public:
  FailOnce(int64_t step, int rank, std::string marker)
      : step_(step), rank_(rank), marker_(std::move(marker)) {}
  std::string state_key() const override { return "FailOnce " + marker_; }
  void on_train_batch_end(train::Trainer& trainer, train::LightningModule&, const train::Batch&,
                          int64_t) override {
    if (trainer.global_step() != step_ || train::get_context().world_rank() != rank_ ||
        std::filesystem::exists(marker_)) {
      return;
    }
    std::ofstream(marker_) << "failed\n";
    std::cout << "failing after step " << step_ << std::endl;
    std::raise(SIGKILL);
  }

 private:
  int64_t step_;
  int rank_;
  std::string marker_;
};

// Counts the optimizer steps it saw, and prints the count at the end.
class StepHook : public train::Callback {
 public:
  std::string state_key() const override { return "StepHook"; }
  void on_before_optimizer_step(train::Trainer&, train::LightningModule&,
                                torch::optim::Optimizer&) override {
    ++calls_;
  }
  void on_fit_end(train::Trainer&, train::LightningModule&) override {
    std::cout << "on_before_optimizer_step calls: " << calls_ << std::endl;
  }

 private:
  int64_t calls_ = 0;
};

// Every bit of a module's parameters and buffers as one number (FNV-1a of
// their bytes, in order), for runs to compare.
uint64_t state_bits(const torch::nn::Module& module) {
  uint64_t hash = 14695981039346656037ull;
  auto tensors = module.parameters();
  for (const auto& buffer : module.buffers()) tensors.push_back(buffer);
  for (const auto& t : tensors) {
    const auto bytes = t.detach().cpu().contiguous();
    const auto* data = static_cast<const unsigned char*>(bytes.data_ptr());
    for (size_t i = 0; i < bytes.nbytes(); ++i) hash = (hash ^ data[i]) * 1099511628211ull;
  }
  return hash;
}

// Prints what the built-in callbacks hold at the end, and the model's bits,
// for the tests to compare.
class PrintState : public train::Callback {
 public:
  void on_fit_end(train::Trainer& trainer, train::LightningModule& module) override {
    if (train::get_context().world_rank() != 0) return;
    std::cout << "model bits " << std::hex << state_bits(module) << std::dec << std::endl;
    for (const auto& callback : trainer.callbacks()) {
      if (auto* c = dynamic_cast<train::ModelCheckpoint*>(callback.get())) {
        std::cout << "best_k:";
        for (const auto& [step, score] : c->best_k_models())
          std::cout << " " << step << "=" << score;
        std::cout << std::endl;
      }
      if (auto* e = dynamic_cast<train::EarlyStopping*>(callback.get())) {
        std::cout << "early_stopping: wait " << e->wait_count() << " best " << e->best_score()
                  << std::endl;
      }
    }
    std::cout << "fit ended at epoch " << trainer.current_epoch() << " step "
              << trainer.global_step() << std::endl;
  }
};

void fit(const train::Config& config) {
  train::enable_reproducibility(config.get<int>("seed", 0));
  const int64_t batches = config.get<int>("batches", 8);
  const int world = train::get_context().world_size();
  std::vector<std::shared_ptr<train::Callback>> callbacks{std::make_shared<PrintState>()};
  callbacks.push_back(std::make_shared<train::ReportCallback>(
      train::ReportOptions().every_n_steps(config.get<int>("report_steps", 0))));
  if (!config.get("scores", "").empty()) {
    callbacks.push_back(std::make_shared<train::ModelCheckpoint>(
        train::ModelCheckpointOptions().monitor("score").save_top_k(2).save_last(true)));
    callbacks.push_back(std::make_shared<train::EarlyStopping>(
        train::EarlyStoppingOptions().monitor("score").patience(config.get<int>("patience", 2))));
  } else {
    callbacks.push_back(std::make_shared<train::ModelCheckpoint>(
        train::ModelCheckpointOptions()
            .monitor(config.get("monitor", ""))
            .every_n_train_steps(config.get<int>("checkpoint_steps", 0))));
  }
  if (auto marker = config.get("marker", ""); !marker.empty() &&
                                              !config.get<bool>("fail_in_validation", false) &&
                                              !config.get<bool>("kill_in_backward", false)) {
    callbacks.push_back(std::make_shared<FailOnce>(config.get<int>("fail_step", 5),
                                                   config.get<int>("fail_rank", 1), marker));
  }
  if (auto marker = config.get("marker2", ""); !marker.empty()) {
    callbacks.push_back(std::make_shared<FailOnce>(config.get<int>("fail_step2", 5),
                                                   config.get<int>("fail_rank2", 1), marker));
  }
  if (config.get<bool>("step_hook", false)) callbacks.push_back(std::make_shared<StepHook>());
  train::Trainer trainer(
      train::TrainerOptions()
          .max_epochs(config.get<int>("epochs", 3))
          .accumulate_grad_batches(config.get<int>("accumulate", 1))
          .gradient_clip_val(config.get<double>("clip", 0))
          .gradient_clip_algorithm(config.get<bool>("clip_by_value", false)
                                       ? train::GradientClip::kValue
                                       : train::GradientClip::kNorm)
          .val_check_interval(config.get<int>("val_every", 0))
          .limit_val_batches(config.get<int>("val_batches", -1))
          .precision(train::precision_from_string(config.get("precision", "32")))
          .log_every_n_steps(config.get<int>("log_every", 4))
          .train_loader(train::LoaderOptions().batch_size(kBatch))
          .val_loader(train::LoaderOptions().batch_size(kBatch))
          .capture(train::CaptureOptions().enabled(config.get<bool>("capture", false))),
      callbacks);
  // 10 validation samples per rank: batches of 4, 4 and 2.
  trainer.fit(std::make_shared<Net>(config), Synthetic(batches * kBatch * world),
              Synthetic(config.get<int>("val_size", 10 * world)));
}

}  // namespace

TRAIN_FUNC(fit);
