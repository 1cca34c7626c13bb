#pragma once

/// Callbacks of train::Trainer (Lightning's Callback) and the three built in:
/// ReportCallback (Ray's RayTrainReportCallback), ModelCheckpoint and
/// EarlyStopping. A callback is called on the train function's thread only.
/// Every rank must pass the same callbacks, in the same order: the trainer
/// checks it at the start of fit.

#include <torch/arg.h>
#include <torch/data/example.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize/archive.h>

#include <cstdint>
#include <exception>
#include <limits>
#include <map>
#include <string>
#include <vector>

namespace train {

class Trainer;
class LightningModule;

/// One batch as the SDK's loaders give it: data and target on the worker's device.
using Batch = torch::data::Example<>;

/// Hooks into train::Trainer::fit. Override the ones you need; each does
/// nothing by default. What a callback asks of the trainer
/// (Trainer::request_checkpoint, request_report, request_stop) takes effect at
/// the next sync point: every step_interval() steps, after a validation run
/// that ends on an optimizer step, and at the end of each epoch. The ranks' requests are combined
/// there (any rank's request counts for all), so every rank acts the same.
class Callback {
 public:
  virtual ~Callback() = default;

  /// The key of this callback's state in a checkpoint. The default is the
  /// class's name; give two callbacks of one class different keys.
  virtual std::string state_key() const;
  /// Every how many optimizer steps this callback wants a sync point (0: none).
  virtual int64_t step_interval() const { return 0; }

  virtual void on_fit_start(Trainer& /*trainer*/, LightningModule& /*module*/) {}
  virtual void on_fit_end(Trainer& /*trainer*/, LightningModule& /*module*/) {}
  virtual void on_train_epoch_start(Trainer& /*trainer*/, LightningModule& /*module*/) {}
  /// After the epoch's validation, with the epoch's metrics in
  /// Trainer::callback_metrics().
  virtual void on_train_epoch_end(Trainer& /*trainer*/, LightningModule& /*module*/) {}
  /// After each training batch (and the optimizer step it completed, if any).
  virtual void on_train_batch_end(Trainer& /*trainer*/, LightningModule& /*module*/,
                                  const Batch& /*batch*/, int64_t /*batch_idx*/) {}
  /// After each validation run, with its metrics in Trainer::callback_metrics().
  virtual void on_validation_end(Trainer& /*trainer*/, LightningModule& /*module*/) {}
  /// After the gradients are averaged (and unscaled), before they are clipped
  /// and the optimizer steps, as Lightning calls it. A replayed captured step
  /// could not call it: with TrainerOptions::capture, a callback that
  /// overrides it keeps every step eager. An override must not call this one,
  /// which does nothing but mark the hook as not overridden.
  virtual void on_before_optimizer_step(Trainer& trainer, LightningModule& module,
                                        torch::optim::Optimizer& optimizer);
  /// Writes this callback's state into a checkpoint the trainer is saving.
  virtual void on_save_checkpoint(Trainer& /*trainer*/,
                                  torch::serialize::OutputArchive& /*archive*/) {}
  /// Reads what on_save_checkpoint wrote, when fit resumes from a checkpoint
  /// that has this callback's state_key().
  virtual void on_load_checkpoint(Trainer& /*trainer*/,
                                  torch::serialize::InputArchive& /*archive*/) {}
  /// When fit fails with `error`, before it is rethrown.
  virtual void on_exception(Trainer& /*trainer*/, LightningModule& /*module*/,
                            const std::exception& /*error*/) {}
};

/// Whether a smaller or a larger monitored value is better.
enum class Mode { kMin, kMax };

/// Options of ReportCallback.
struct ReportOptions {
  /// Report at the end of every n-th epoch (0: never at epoch ends).
  TORCH_ARG(int64_t, every_n_epochs) = 1;
  /// Report every n optimizer steps too (0: never between epoch ends), with
  /// the values logged with on_step.
  TORCH_ARG(int64_t, every_n_steps) = 0;
};

/// Sends the logged metrics to train::report (result.jsonl, the progress
/// line), with a checkpoint when one was asked for, as Ray's
/// RayTrainReportCallback does; but every N steps or every N epochs, not only
/// per epoch. The trainer adds one (every epoch) when none is given.
class ReportCallback : public Callback {
 public:
  explicit ReportCallback(ReportOptions options = {});
  int64_t step_interval() const override { return options_.every_n_steps(); }
  void on_train_batch_end(Trainer& trainer, LightningModule& module, const Batch& batch,
                          int64_t batch_idx) override;
  void on_train_epoch_end(Trainer& trainer, LightningModule& module) override;

 private:
  ReportOptions options_;
};

/// Options of ModelCheckpoint.
struct ModelCheckpointOptions {
  /// The logged metric that ranks checkpoints; empty: none, every checkpoint
  /// is the best (the latest save_top_k are the top k).
  TORCH_ARG(std::string, monitor) = "";
  TORCH_ARG(Mode, mode) = Mode::kMin;
  /// How many of the best checkpoints to keep (-1: all). A checkpoint that
  /// would not be among them is not saved at all, unless save_last.
  TORCH_ARG(int64_t, save_top_k) = 1;
  /// Save at every check, best or not, so that a restart resumes from the
  /// latest state.
  TORCH_ARG(bool, save_last) = false;
  /// Check at the end of every n-th epoch (0: not at epoch ends).
  TORCH_ARG(int64_t, every_n_epochs) = 1;
  /// Check every n optimizer steps too (0: not between epoch ends).
  TORCH_ARG(int64_t, every_n_train_steps) = 0;
};

/// Saves checkpoints (the model, optimizer, scheduler, loop position, every
/// callback's state, each rank's random generators) through train::report, as
/// Lightning's ModelCheckpoint does, keeping track of the best save_top_k by
/// `monitor` (a NaN is never among them). It checks at epoch ends (with
/// validation and a monitor: those that validated), after validations within
/// an epoch (with a monitor), and every every_n_train_steps optimizer steps,
/// with the values averaged at that step, saving at most once per step; a
/// monitor not logged yet is passed over until validation has run, an error
/// after. Its record of the best lives in the checkpoint, so a restart or
/// an elastic regroup keeps it. The run's retention deletes checkpoints: run
/// with `--num-to-keep K --checkpoint-score-attribute MONITOR
/// --checkpoint-score-order min|max` to keep on storage exactly the top K
/// (and the latest, from which a restart resumes). The trainer adds one
/// without a monitor (a checkpoint every epoch) when none is given, unless
/// TrainerOptions::enable_checkpointing is false.
class ModelCheckpoint : public Callback {
 public:
  explicit ModelCheckpoint(ModelCheckpointOptions options = {});
  /// "ModelCheckpoint{monitor=..., mode=..., every_n_train_steps=..., every_n_epochs=...}".
  std::string state_key() const override;
  int64_t step_interval() const override { return options_.every_n_train_steps(); }
  void on_train_batch_end(Trainer& trainer, LightningModule& module, const Batch& batch,
                          int64_t batch_idx) override;
  void on_validation_end(Trainer& trainer, LightningModule& module) override;
  void on_train_epoch_end(Trainer& trainer, LightningModule& module) override;
  void on_save_checkpoint(Trainer& trainer, torch::serialize::OutputArchive& archive) override;
  void on_load_checkpoint(Trainer& trainer, torch::serialize::InputArchive& archive) override;

  /// The best monitored value so far (NaN before the first check).
  double best_model_score() const;
  /// The global steps of the best checkpoints with their scores, best first.
  std::vector<std::pair<int64_t, double>> best_k_models() const;
  const ModelCheckpointOptions& options() const { return options_; }

  /// Takes `score` of the checkpoint at `step` into the top k; returns
  /// whether it belongs there. Pure: no trainer needed.
  bool consider(int64_t step, double score);

 private:
  void check(Trainer& trainer);
  bool better(double a, double b) const;

  ModelCheckpointOptions options_;
  std::vector<std::pair<int64_t, double>> best_;  // best first
  int64_t last_step_ = -1;                        // the step last checked
};

/// Options of EarlyStopping.
struct EarlyStoppingOptions {
  /// The logged metric to watch (required).
  TORCH_ARG(std::string, monitor) = "";
  TORCH_ARG(Mode, mode) = Mode::kMin;
  /// Checks in a row without improvement before training stops.
  TORCH_ARG(int64_t, patience) = 3;
  /// The least change that counts as an improvement.
  TORCH_ARG(double, min_delta) = 0.0;
  /// Stop (with std::runtime_error) when the monitored value is missing at a
  /// check; false: skip the check.
  TORCH_ARG(bool, strict) = true;
};

/// Stops fit when `monitor` has not improved for `patience` checks in a row,
/// or is NaN or infinite (Lightning's EarlyStopping). It checks after each
/// validation run, or at each epoch end when there is no validation. The decision is the same on
/// every rank, and its count survives a restart (it is in the checkpoint).
class EarlyStopping : public Callback {
 public:
  /// Throws std::invalid_argument when the monitor is empty or patience < 0.
  explicit EarlyStopping(EarlyStoppingOptions options);
  /// "EarlyStopping{monitor=..., mode=...}".
  std::string state_key() const override;
  void on_validation_end(Trainer& trainer, LightningModule& module) override;
  void on_train_epoch_end(Trainer& trainer, LightningModule& module) override;
  void on_save_checkpoint(Trainer& trainer, torch::serialize::OutputArchive& archive) override;
  void on_load_checkpoint(Trainer& trainer, torch::serialize::InputArchive& archive) override;

  /// Checks without improvement so far.
  int64_t wait_count() const { return wait_count_; }
  double best_score() const { return best_; }
  /// The epoch in which it stopped training (-1: not stopped).
  int64_t stopped_epoch() const { return stopped_epoch_; }
  /// Takes one value; returns whether training should stop: `patience`
  /// values in a row without improvement, or one that is NaN or infinite.
  /// Pure.
  bool update(double value);

 private:
  void check(Trainer& trainer);

  EarlyStoppingOptions options_;
  double best_;
  int64_t wait_count_ = 0;
  int64_t stopped_epoch_ = -1;
};

}  // namespace train
