#pragma once

// The state of one Trainer::fit: the module and its loaders, the optimizer,
// the loop's position, the logged values and what callbacks asked for. One
// per fit, owned by the Trainer, touched on the train function's thread only.
// The loop is in trainer.cpp; saving and resuming in trainer_state.cpp.

#include <train/trainer.h>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/catch_up.h"
#include "core/collectives.h"
#include "trainer/metric_log.h"

namespace train {

namespace detail {
/// The name a callback's state has inside trainer.pt: its state_key() with
/// every character but letters and digits as '_' (archive keys are
/// TorchScript attribute names).
std::string callback_archive_key(const std::string& state_key);
/// LibTorch's clip_grad_norm_ with norm 2 (its operations, so its results),
/// without reading the norm on the host: no synchronisation per step, and a
/// step that can be captured.
void clip_grad_norm(const std::vector<torch::Tensor>& parameters, double max_norm);
/// Set by Callback's own on_before_optimizer_step, which a callback that
/// overrides it does not reach: such a callback keeps the steps eager.
extern thread_local bool default_hook_reached;
}  // namespace detail

struct Trainer::Fit {
  Fit(Context context, std::shared_ptr<LightningModule> module,
      std::unique_ptr<detail::BatchStream> train, std::unique_ptr<detail::BatchStream> val);

  void run(Trainer& trainer);
  void check_same_setup(const Trainer& trainer);
  void train_epoch(Trainer& trainer);
  /// One batch: forward, backward, and (unless accumulating) the step.
  /// Returns whether the optimizer stepped.
  bool training_batch(Trainer& trainer, Batch& data, int64_t index, bool last);
  /// training_step under autocast, and backward on its loss (scaled, divided
  /// by the accumulated batches). Returns the loss.
  torch::Tensor forward_backward(Trainer& trainer, Batch& data, int64_t index, bool accumulating);
  /// Unscaling, on_before_optimizer_step, clipping, the optimizer's (or the
  /// GradScaler's) step and zero_grad.
  void optimizer_step(Trainer& trainer);

  void validate(Trainer& trainer);
  bool steps_done(const TrainerOptions& options) const;
  bool step_sync_due(const Trainer& trainer) const;
  /// The latest step values, averaged across ranks, into callback_metrics.
  /// A collective, at step sync points.
  void update_step_values();
  /// Where the ranks agree on the callbacks' requests, and report (with a
  /// checkpoint) when asked to; after a step sync, rank 0 prints the
  /// prog_bar values every log_every_n_steps. A collective.
  void sync_point(Trainer& trainer, bool step_sync, int64_t batches);

  // TrainerOptions::capture (trainer_capture.cpp)
  /// Makes `capture` when the loop allows a captured step; else says why.
  void setup_capture(Trainer& trainer);
  /// One step through `capture`, eager or replayed, and what it logged.
  void captured_batch(Batch& data, int64_t index);
  /// Drops the captured graph, if any: the next steps warm up and capture
  /// again.
  void recapture();
  /// Stops capturing for good, saying why in one line.
  void stop_capturing(const std::string& reason);

  /// What every rank must fit with, as text: compared across the ranks.
  std::string setup_text(const Trainer& trainer) const;

  // trainer_state.cpp
  void load_model(const Checkpoint& checkpoint);
  void load_state(Trainer& trainer, const Checkpoint& checkpoint);
  void save_checkpoint(Trainer& trainer, const std::filesystem::path& dir);
  /// trainer.pt's keys: the loop's position, the scheduler's steps, the
  /// GradScaler and the callbacks' states.
  void write_state(Trainer& trainer, torch::serialize::OutputArchive& state);
  void read_position(torch::serialize::InputArchive& state);
  /// The rest of write_state's keys, `load_optimizer` called where the
  /// optimizer's state belongs (after the scheduler's replay). `source`
  /// names where the state came from, for errors.
  void read_rest(Trainer& trainer, torch::serialize::InputArchive& state, const std::string& source,
                 const std::function<void()>& load_optimizer);

  // trainer_catch_up.cpp: a replacement catches up at a step boundary.
  /// On a rank of the group whose vote said a replacement joins: forms the
  /// group with it, and sends it the models and this state.
  void take_replacement(Trainer& trainer);
  /// On the replacement, after prepare_model joined the group: takes the
  /// state from the group's first rank.
  void catch_up(Trainer& trainer);
  /// Both: the state from the group's first rank, over the current group.
  void exchange_state(Trainer& trainer, bool replacement);

  Context context;
  std::shared_ptr<LightningModule> module;
  std::unique_ptr<detail::BatchStream> train, val;
  /// The run's group: null with one worker; after a recovery in place, the
  /// survivors'.
  static c10::intrusive_ptr<c10d::ProcessGroup> group() { return detail::run_group_or_null(); }
  /// `log`'s values averaged across the group (MetricLog::values).
  std::map<std::string, double> synced_values(detail::MetricLog& log,
                                              detail::MetricLog::Which which);
  torch::Device device;

  std::shared_ptr<torch::optim::Optimizer> optimizer;
  std::shared_ptr<torch::optim::LRScheduler> scheduler;
  SchedulerInterval interval = SchedulerInterval::kEpoch;
  int64_t scheduler_steps = 0;  // replayed on resume: LibTorch's schedulers save nothing
  std::optional<GradScaler> scaler;

  int64_t epoch = 0;
  int64_t batch = 0;        // batches of this epoch done
  bool epoch_done = false;  // its end was reached: a checkpoint resumes at the next
  int64_t global_step = 0;
  int64_t batch_size = 0;  // the current batch's, the weight of what it logs
  bool validating = false;
  bool in_step = false;          // in training_step or validation_step
  bool stepped = false;          // the batch that just ended stepped the optimizer
  bool at_epoch_end = false;     // validation and on_train_epoch_end of the epoch
  bool validated_epoch = false;  // this epoch validated
  bool validation_ran = false;   // any validation ran in this fit
  detail::MetricLog train_log, val_log;
  std::map<std::string, double> callback_metrics;
  bool want_report = false, want_checkpoint = false, want_stop = false;

  /// TrainerOptions::capture, where the loop allows it: null otherwise.
  std::unique_ptr<CapturedStep> capture;
  int64_t capture_generation = 0;  // of the group the step runs in
  /// A value training_step logged, added to train_log after its step: a
  /// replayed step adds the captured step's again, now holding its values.
  struct StepLog {
    std::string name;
    torch::Tensor tensor;  // undefined: `value`, a number from the host
    double value = 0, weight = 0;
    bool on_step = false, on_epoch = false, prog_bar = false, sync_dist = false;
  };
  bool defer_logs = false;  // in a step through `capture`
  bool step_ran = false;    // its step function ran (not replayed)
  int64_t step_index = 0;   // the batch index it runs for
  /// The GradScaler as it was before a step that may be captured: a capture
  /// that fails leaves it unscaled, and its eager run starts from this.
  std::optional<GradScaler> scaler_before;
  std::optional<std::string> overriding_hook;  // a callback with on_before_optimizer_step
  std::vector<StepLog> step_logs;              // what the step that ran logged
  std::vector<StepLog> replayed_logs;          // what the captured one logged

  int64_t ordinal = 1;    // which fit of the train function: 1 for the first
  bool stopping = false;  // agreed by every rank
};

}  // namespace train
