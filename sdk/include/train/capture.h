#pragma once

#include <torch/arg.h>
#include <torch/types.h>

#include <functional>
#include <memory>
#include <string>

namespace train {

/// Options of CapturedStep.
struct CaptureOptions {
  /// Whether to capture at all; false runs every step eagerly (one code path
  /// for both).
  TORCH_ARG(bool, enabled) = true;
  /// Eager steps before the capture: they make the gradients and the
  /// optimizer's state, which the graph then reuses (as it does the buckets
  /// prepare_model made).
  TORCH_ARG(int, warmup_steps) = 3;
};

/// One training step (forward, backward with the reducer's collectives, the
/// optimizer's step) captured once as a CUDA graph and replayed, so that a
/// step costs one launch from the host instead of hundreds: what
/// torch.cuda.graph does for a whole-network capture in Python.
///
///   train::optim::Adam optimizer(model->parameters());
///   train::CapturedStep step([&](const torch::Tensor& data, const torch::Tensor& target) {
///     auto loss = torch::nn::functional::cross_entropy(model->forward(data), target);
///     optimizer.zero_grad();
///     loss.backward();
///     optimizer.step();
///     return loss;
///   });
///   for (auto& batch : loader) total += step(batch.data, batch.target).item<double>();
///
/// What the step may do: operations on the GPU only, on tensors of the same
/// shapes every step (LoaderOptions::drop_last), with a train::optim
/// optimizer (its fused step reads no count from the host; LibTorch's
/// optimizers bake their step count into the graph). A host
/// synchronisation inside (`item()`, printing a tensor), a learning rate that
/// changes (call reset() after the scheduler's step), or Python-side state
/// cannot be replayed. The step runs eagerly, saying why in one line on
/// stderr, where capture is impossible: on the CPU, a LibTorch without CUDA
/// graphs, a world of several ranks on Gloo (capture needs NCCL or one
/// worker), a batch whose shapes differ from the captured ones (that step
/// only; the capture itself comes after warmup_steps batches of one shape in
/// a row, with the next of that shape), or a capture that failed (from then on, until reset()). A
/// capture that fails has run the step's host code once: the step must be safe to run again on the
/// same batch (zero_grad, backward and step are; the prepared models' reducers start their
/// iteration again). Not thread-safe: one per training loop, called from the thread that trains.
class CapturedStep {
 public:
  /// `step` takes a batch's data and target and returns the loss.
  using Step = std::function<torch::Tensor(const torch::Tensor&, const torch::Tensor&)>;

  explicit CapturedStep(Step step, CaptureOptions options = {});
  ~CapturedStep();
  CapturedStep(const CapturedStep&) = delete;
  CapturedStep& operator=(const CapturedStep&) = delete;

  /// Runs one step on this batch and returns its loss, detached from autograd
  /// (kept, an eager step's graph would meet a later capture). Replayed, the
  /// loss is the graph's own tensor, overwritten by the next step: clone() it
  /// to keep it. Rethrows what the step throws when it runs eagerly.
  torch::Tensor operator()(const torch::Tensor& data, const torch::Tensor& target);

  /// Whether the steps are now replayed from a graph.
  bool captured() const;
  /// Whether the step function is running under capture now: what it does on
  /// the host will not run again at replays (a step may refuse, by throwing,
  /// what a replay cannot repeat; the capture then fails and the steps run
  /// eagerly, saying why).
  bool capturing() const;
  /// Why the steps run eagerly ("" while capturing is still possible).
  const std::string& eager_reason() const;
  /// Drops the graph: the next steps warm up and capture again. Call it after
  /// a learning rate changed, or after torch::load into the model or the
  /// optimizer (the graph updates the tensors it captured, not new ones).
  void reset();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace train
