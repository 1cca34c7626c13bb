// TrainerOptions::capture: the Trainer's optimizer step through a
// train::CapturedStep. What training_step logs is added after the step, and
// the captured step's logged tensors again after each replay; what a replay
// cannot repeat keeps the steps eager, saying why.

#include <train/optim.h>
#include <train/trainer.h>

#include <torch/version.h>

#include <iostream>

#include "core/host.h"
#include "trainer/trainer_fit.h"

namespace train {

void Trainer::Fit::setup_capture(Trainer& trainer) {
  const auto& options = trainer.options_;
  if (!options.capture().enabled()) return;
  if (dynamic_cast<optim::AmpStep*>(optimizer.get()) == nullptr) {
    return stop_capturing(
        "the optimizer is not train::optim's SGD, Adam or AdamW: LibTorch's read their step "
        "count on the host, and a replayed step would keep the captured one");
  }
  if (options.accumulate_grad_batches() > 1) {
    return stop_capturing("accumulate_grad_batches is " +
                          std::to_string(options.accumulate_grad_batches()) +
                          ", and a captured step is one whole optimizer step");
  }
  if (scheduler && interval == SchedulerInterval::kStep) {
    return stop_capturing(
        "the LR scheduler steps every optimizer step, and a replayed step keeps the learning "
        "rate it was captured with (a scheduler of SchedulerInterval::kEpoch is captured again "
        "at each epoch)");
  }
#if TORCH_VERSION_MAJOR < 2
  if (device.is_cuda() && options.train_loader().workers().value_or(1) != 0) {
    return stop_capturing(
        "LibTorch 1.x captures in CUDA's global mode, which the loader's threads would break "
        "with their pinned-memory allocations: give train_loader workers(0)");
  }
#endif
  capture_generation = detail::current_membership().generation;
  capture = std::make_unique<CapturedStep>(
      [this, &trainer](const torch::Tensor& data, const torch::Tensor& target) {
        if (step_ran) {
          // Again, after a capture that failed: it set the gradients to what
          // its captured kernels would have written, which never ran, and
          // may have unscaled with the GradScaler.
          optimizer->zero_grad();
          if (scaler_before) scaler = scaler_before;
        }
        step_ran = true;
        step_logs.clear();
        Batch batch(data, target);
        auto loss = forward_backward(trainer, batch, step_index, /*accumulating=*/false);
        optimizer_step(trainer);
        return loss;
      },
      options.capture());
}

void Trainer::Fit::captured_batch(Batch& data, int64_t index) {
  if (const auto generation = detail::current_membership().generation;
      generation != capture_generation) {   // the group changed: its collectives too
    if (capture->eager_reason().empty()) {  // warm up again in the new group
      capture->reset();
      replayed_logs.clear();
    }
    capture_generation = generation;
  }
  const bool was_captured = capture->captured();
  // A step that may be captured starts from a copy of the scaler (its
  // tensors shared: a failed capture ran nothing on them).
  if (scaler && !was_captured) {
    scaler_before = scaler;
  } else {
    scaler_before.reset();
  }
  step_index = index;
  step_ran = false;
  step_logs.clear();
  defer_logs = true;
  struct Undefer {
    bool& flag;
    ~Undefer() { flag = false; }
  } undefer{defer_logs};
  (*capture)(data.data, data.target);
  defer_logs = false;
  scaler_before.reset();
  // The step that captured logged the graph's own tensors: each replay
  // overwrites them with its values, which are added again.
  if (step_ran && !was_captured && capture->captured()) replayed_logs = step_logs;
  for (const auto& l : step_ran ? step_logs : replayed_logs) {
    train_log.add(l.name, l.tensor.defined() ? &l.tensor : nullptr, l.value, l.weight, l.on_step,
                  l.on_epoch, l.prog_bar, l.sync_dist);
  }
  if (overriding_hook) {  // seen at the first step, which is eager
    stop_capturing("callback '" + *overriding_hook +
                   "' overrides on_before_optimizer_step, which a replayed step could not call");
  }
}

void Trainer::Fit::recapture() {
  if (!capture || !capture->captured()) return;  // a failed capture is not tried again
  capture->reset();
  replayed_logs.clear();
}

void Trainer::Fit::stop_capturing(const std::string& reason) {
  capture.reset();
  replayed_logs.clear();
  std::cerr << "train::Trainer: steps run eagerly: " << reason << std::endl;
}

}  // namespace train
