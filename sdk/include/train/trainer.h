#pragma once

/// train::LightningModule and train::Trainer: what PyTorch Lightning gives a
/// Python train function, for LibTorch. The module says what one step is; the
/// trainer runs the loop around it: prepare_model and prepare_data_loader,
/// the sampler's epoch, gradient accumulation, clipping, mixed precision,
/// validation, metrics averaged across ranks, reports, checkpoints, and
/// resuming from the latest checkpoint by itself.
///
///   struct Net : train::LightningModule {
///     torch::Tensor training_step(train::Batch& batch, int64_t) override {
///       auto loss = torch::nn::functional::cross_entropy(forward(batch.data), batch.target);
///       log("loss", loss, train::LogOptions().prog_bar(true));
///       return loss;
///     }
///     train::OptimizerConfig configure_optimizers() override {
///       return {std::make_shared<train::optim::Adam>(parameters())};
///     }
///   };
///   train::Trainer(train::TrainerOptions().max_epochs(2)).fit(std::make_shared<Net>(), data);
///
/// A Trainer is used on the train function's thread, inside a train function
/// started by trainrun; it holds the module while fit runs.

#include <train/amp.h>
#include <train/callbacks.h>
#include <train/capture.h>
#include <train/checkpoint.h>
#include <train/context.h>
#include <train/data.h>
#include <train/metric.h>
#include <train/model.h>

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/schedulers/lr_scheduler.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

namespace train {

/// The precision of the forward pass (Lightning's `precision`).
enum class Precision {
  k32,         ///< float32 throughout
  kBF16Mixed,  ///< "bf16-mixed": train::Autocast to bfloat16, parameters in float32
  kFP16Mixed,  ///< "16-mixed": train::Autocast to float16 and a GradScaler (CUDA only)
};
/// "32", "bf16-mixed" (or "bf16"), "16-mixed" (or "16", "fp16"); throws
/// std::invalid_argument naming the accepted values otherwise.
Precision precision_from_string(const std::string& text);

/// How gradients are clipped (Lightning's gradient_clip_algorithm).
enum class GradientClip { kNorm, kValue };

/// When a scheduler steps.
enum class SchedulerInterval { kEpoch, kStep };

/// What LightningModule::configure_optimizers returns: one optimizer over the
/// module's parameters and, optionally, a LibTorch LR scheduler of it.
struct OptimizerConfig {
  OptimizerConfig(std::shared_ptr<torch::optim::Optimizer> optimizer,  // NOLINT
                  std::shared_ptr<torch::optim::LRScheduler> scheduler = nullptr,
                  SchedulerInterval interval = SchedulerInterval::kEpoch)
      : optimizer(std::move(optimizer)), scheduler(std::move(scheduler)), interval(interval) {}
  std::shared_ptr<torch::optim::Optimizer> optimizer;
  std::shared_ptr<torch::optim::LRScheduler> scheduler;
  SchedulerInterval interval;
};

/// Options of LightningModule::log (Lightning's self.log arguments).
struct LogOptions {
  /// Keep the value of each step: averaged, printed and put in
  /// callback_metrics() at each step sync point (every log_every_n_steps or
  /// callback step_interval() steps) and at the epoch's end, and reported
  /// every ReportOptions::every_n_steps. Only in training_step, where it is
  /// the default.
  TORCH_ARG(c10::optional<bool>, on_step) = c10::nullopt;
  /// Average the values over the epoch (over the validation run in
  /// validation_step), weighted by batch size. Default: false in
  /// training_step, true everywhere else (validation_step, the epoch-end
  /// hooks, where the weight is 1). Both on: the metrics are reported as
  /// NAME_step and NAME_epoch.
  TORCH_ARG(c10::optional<bool>, on_epoch) = c10::nullopt;
  /// Print it on rank 0 every TrainerOptions::log_every_n_steps steps.
  TORCH_ARG(bool, prog_bar) = false;
  /// Average across ranks too: Σ value·n / Σ n over every rank's batches, all
  /// metrics in one allreduce. False: each rank's own values (rank 0's are
  /// reported; each rank's callbacks see its own).
  TORCH_ARG(bool, sync_dist) = true;
  /// The weight n of this value; 0: the current batch's size.
  TORCH_ARG(int64_t, batch_size) = 0;
};

/// Options of Trainer (pl.Trainer's arguments).
struct TrainerOptions {
  TORCH_ARG(int64_t, max_epochs) = 1;
  /// Stop after this many optimizer steps in all (-1: no limit).
  TORCH_ARG(int64_t, max_steps) = -1;
  /// Training batches per epoch (-1: all).
  TORCH_ARG(int64_t, limit_train_batches) = -1;
  /// Validation batches per rank per validation run (-1: all; 0: no validation).
  TORCH_ARG(int64_t, limit_val_batches) = -1;
  /// Also validate every n training batches within an epoch (0: only at epoch ends).
  TORCH_ARG(int64_t, val_check_interval) = 0;
  /// Validate at the end of every n-th epoch.
  TORCH_ARG(int64_t, check_val_every_n_epoch) = 1;
  /// Step the optimizer every n batches; gradients of the others are
  /// accumulated locally (train::NoSync), so they cost no communication.
  TORCH_ARG(int64_t, accumulate_grad_batches) = 1;
  /// Clip gradients to this (norm or value) before each step (0: no clipping).
  TORCH_ARG(double, gradient_clip_val) = 0;
  TORCH_ARG(GradientClip, gradient_clip_algorithm) = GradientClip::kNorm;
  /// Sync point and printing of prog_bar step values every n steps (0: never).
  TORCH_ARG(int64_t, log_every_n_steps) = 50;
  TORCH_ARG(Precision, precision) = Precision::k32;
  /// Add a ModelCheckpoint (a checkpoint every epoch) when none is given.
  TORCH_ARG(bool, enable_checkpointing) = true;
  /// Resume from train::get_checkpoint() when there is one.
  TORCH_ARG(bool, resume) = true;
  /// How checkpoints are uploaded (kAsync: report returns before the upload).
  TORCH_ARG(CheckpointUploadMode, checkpoint_upload) = CheckpointUploadMode::kSync;
  /// The training loader (batch size per rank, shuffle, seed, workers).
  TORCH_ARG(LoaderOptions, train_loader) = LoaderOptions().batch_size(32);
  /// The validation loader's batch size and workers; it never shuffles and
  /// gives each sample to at most one rank.
  TORCH_ARG(LoaderOptions, val_loader) = LoaderOptions().batch_size(32);
  /// prepare_model's options.
  TORCH_ARG(ModelOptions, model) = {};
  /// GradScaler's options, for Precision::kFP16Mixed.
  TORCH_ARG(GradScalerOptions, grad_scaler) = {};
  /// Capture the optimizer step (training_step, backward with the reducer's
  /// collectives, clipping, the GradScaler, the optimizer's step) as one CUDA
  /// graph after warmup_steps eager ones, and replay it (train::CapturedStep):
  /// `.capture(train::CaptureOptions())`. Off by default. A replay runs no
  /// host code: training_step must log tensors computed on the GPU and update
  /// no train::Metric, and what it decides on the host (from batch_idx) stays
  /// as captured until the next epoch, which captures again (recapture()
  /// within one). Validation, the callbacks' other hooks and reports run
  /// eagerly. Steps run eagerly, saying why in one line, with an optimizer
  /// that is not train::optim's, accumulate_grad_batches above 1, a
  /// scheduler stepped every step, a callback's own on_before_optimizer_step
  /// (one that calls the base class's is not seen), or where CapturedStep
  /// cannot capture (the CPU, Gloo with several ranks, a host
  /// synchronisation in the step).
  TORCH_ARG(CaptureOptions, capture) = CaptureOptions().enabled(false);
};

/// The module the trainer runs (Lightning's LightningModule): a
/// torch::nn::Module that also says what a training step is, optionally a
/// validation step, and which optimizer to use. Register submodules and
/// parameters as for any module.
class LightningModule : public torch::nn::Module {
 public:
  using torch::nn::Module::Module;

  /// The loss of one batch; the trainer runs backward on it. `batch_idx`
  /// counts from 0 in each epoch.
  virtual torch::Tensor training_step(Batch& batch, int64_t batch_idx) = 0;
  /// One validation batch, under torch::NoGradGuard and in eval mode; log
  /// what it measures. The default does nothing.
  virtual void validation_step(Batch& batch, int64_t batch_idx);
  /// The optimizer (and scheduler), made over parameters() after the module
  /// is on its device.
  virtual OptimizerConfig configure_optimizers() = 0;
  /// After each validation run, before its metrics are averaged: the place to
  /// log a Metric's compute().
  virtual void on_validation_epoch_end() {}
  /// At the end of each training epoch, before its metrics are averaged.
  virtual void on_train_epoch_end() {}

  /// Logs a value of the current step (a scalar tensor: no copy to the host
  /// until it is reported). Every rank must log the same names with
  /// sync_dist; a rank that differs makes every rank throw
  /// std::runtime_error naming the names, at the next average. Throws
  /// std::logic_error outside fit, std::invalid_argument for a tensor of more
  /// than one element or an empty name.
  void log(const std::string& name, const torch::Tensor& value, const LogOptions& options = {});
  void log(const std::string& name, double value, const LogOptions& options = {});

  /// The trainer running this module; throws std::logic_error outside fit.
  Trainer& trainer() const;
  /// The epoch being trained and the optimizer steps taken, from the trainer.
  int64_t current_epoch() const;
  int64_t global_step() const;

 private:
  friend class Trainer;
  Trainer* trainer_ = nullptr;
};

namespace detail {

/// One loader's epochs for the trainer, whatever the dataset's type.
class BatchStream {
 public:
  virtual ~BatchStream() = default;
  /// Starts epoch `epoch` at its batch `first` (the ones before are skipped
  /// by the sampler, unread, when it can).
  virtual void start(int64_t epoch, int64_t first) = 0;
  /// The next batch of the epoch, or nullptr at its end.
  virtual Batch* next() = 0;
  /// Batches per epoch on this rank.
  virtual int64_t size() const = 0;
  /// Whether the loader's saved position is where it is (a sharded
  /// dataset's), rather than the batch the trainer counts; then save and load
  /// carry it.
  virtual bool saves_position() const { return false; }
  virtual void save(torch::serialize::OutputArchive& /*archive*/) const {}
  virtual void load(torch::serialize::InputArchive& /*archive*/) {}
};

template <typename Loader>
class LoaderStream final : public BatchStream {
 public:
  explicit LoaderStream(Loader loader) : loader_(std::move(loader)) {}
  void start(int64_t epoch, int64_t first) override {
    loader_.set_epoch(static_cast<size_t>(epoch));
    const bool skipped = first > 0 && loader_.resume(static_cast<size_t>(first));
    it_.emplace(loader_.begin());
    end_.emplace(loader_.end());
    started_ = false;
    if (!skipped) {
      for (int64_t i = 0; i < first && next() != nullptr; ++i) {
      }
    }
  }
  Batch* next() override {
    if (started_) ++*it_;
    started_ = true;
    if (!(*it_ != *end_)) return nullptr;
    return &**it_;
  }
  int64_t size() const override { return static_cast<int64_t>(loader_.size()); }
  bool saves_position() const override {
    return detail::saves_position<typename Loader::SamplerType>::value;
  }
  void save(torch::serialize::OutputArchive& archive) const override { loader_.save(archive); }
  void load(torch::serialize::InputArchive& archive) override { loader_.load(archive); }

 private:
  Loader loader_;
  std::optional<typename Loader::Iterator> it_, end_;
  bool started_ = false;
};

}  // namespace detail

/// Runs a LightningModule's training (pl.Trainer). Construct it with the
/// options and callbacks, then call fit() once.
class Trainer {
 public:
  /// Throws std::invalid_argument for an option out of range (a count below
  /// its least value), a null callback or two callbacks with one state_key();
  /// fit throws it for kFP16Mixed on the CPU.
  explicit Trainer(TrainerOptions options = {},
                   std::vector<std::shared_ptr<Callback>> callbacks = {});
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  /// Trains `module` on `train_set` (and validates on `val_set`), each a
  /// LibTorch dataset as prepare_data_loader takes it. Resumes from the
  /// run's latest checkpoint when there is one (TrainerOptions::resume).
  /// Every rank must call it with the same options and callbacks. Rethrows
  /// what the module or a callback throws, after the callbacks' on_exception.
  template <typename Module, typename TrainSet>
  void fit(const std::shared_ptr<Module>& module, TrainSet train_set) {
    static_assert(std::is_base_of_v<LightningModule, Module>,
                  "Trainer::fit takes a module derived from train::LightningModule");
    auto train = stream(std::move(train_set), options_.train_loader());
    run_fit(module, std::move(train), nullptr);
  }
  template <typename Module, typename TrainSet, typename ValSet>
  void fit(const std::shared_ptr<Module>& module, TrainSet train_set, ValSet val_set) {
    static_assert(std::is_base_of_v<LightningModule, Module>,
                  "Trainer::fit takes a module derived from train::LightningModule");
    auto train = stream(std::move(train_set), options_.train_loader());
    auto val = stream(std::move(val_set),
                      LoaderOptions(options_.val_loader()).shuffle(false).allow_duplicates(false));
    run_fit(module, std::move(train), std::move(val));
  }

  /// The epoch being trained (after fit: the epochs done).
  int64_t current_epoch() const;
  /// Optimizer steps taken, over all epochs.
  int64_t global_step() const;
  /// The latest averaged value of every logged metric, by reported name.
  const std::map<std::string, double>& callback_metrics() const;
  /// Whether fit validates (it was given a validation set and may use it).
  bool has_validation() const;
  /// Whether a validation ran in this fit, and in this epoch.
  bool validation_has_run() const;
  bool validated_this_epoch() const;
  /// Whether the loop is at the end of an epoch (its validation and
  /// on_train_epoch_end), rather than within it.
  bool is_epoch_end() const;
  /// Whether the batch that just ended stepped the optimizer (false within
  /// gradient accumulation and at the epoch's end).
  bool optimizer_stepped() const;
  const TrainerOptions& options() const { return options_; }
  /// The callbacks, the added defaults included.
  const std::vector<std::shared_ptr<Callback>>& callbacks() const { return callbacks_; }

  /// At the next sync point, report and save a checkpoint.
  void request_checkpoint();
  /// At the next sync point, report the metrics.
  void request_report();
  /// Stop after the current epoch.
  void request_stop();
  /// With TrainerOptions::capture: capture the step again at the next batch.
  /// Call it after changing within an epoch what the step does on the host
  /// (a learning rate, requires_grad, weights loaded into new tensors, a
  /// module's mode); each epoch's start does it by itself.
  void recapture();
  /// Whether training stops after this epoch (on every rank alike).
  bool should_stop() const;

 private:
  friend class LightningModule;
  struct Fit;

  template <typename Dataset>
  static std::unique_ptr<detail::BatchStream> stream(Dataset dataset,
                                                     const LoaderOptions& options) {
    auto loader = prepare_data_loader(std::move(dataset), options);
    return std::make_unique<detail::LoaderStream<decltype(loader)>>(std::move(loader));
  }
  void run_fit(std::shared_ptr<LightningModule> module, std::unique_ptr<detail::BatchStream> train,
               std::unique_ptr<detail::BatchStream> val);
  void log(const std::string& name, const torch::Tensor* tensor, double value,
           const LogOptions& options);

  TrainerOptions options_;
  std::vector<std::shared_ptr<Callback>> callbacks_;
  std::unique_ptr<Fit> fit_;
};

/// Loads the model of a checkpoint written by Trainer into `module` (on the
/// CPU): Lightning's load_from_checkpoint. Throws std::runtime_error when the
/// checkpoint has no model.pt or it does not fit the module.
void load_from_checkpoint(torch::nn::Module& module, const Checkpoint& checkpoint);

}  // namespace train
