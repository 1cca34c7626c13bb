#pragma once

/// Metrics whose state is summed (or maxed, or gathered) across ranks once,
/// when the value is computed, as TorchMetrics does: update() every batch
/// costs no communication. Not thread-safe; every rank must hold the same
/// metrics and call compute() at the same points (it is a collective).

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/types.h>

#include <map>
#include <string>
#include <vector>

namespace train {

/// How a state is combined across ranks.
enum class Reduction { kSum, kMax, kMin, kCat };

/// A metric's base: states registered with add_state, combined across the
/// run's ranks by compute() (one allreduce per kind of reduction that has
/// states, one allgather per kCat state), then turned into a value by
/// compute_value(). Derive from it and write update() and compute_value().
/// Its states are replaced at each update, which a CUDA graph cannot replay:
/// state() throws std::runtime_error inside a train::CapturedStep's capture,
/// which then fails and runs the steps eagerly.
class Metric {
 public:
  virtual ~Metric() = default;

  /// The value over everything updated since the last reset(), on every rank
  /// alike. A collective inside a train function of more than one worker.
  /// Throws std::runtime_error when the ranks' states have different shapes
  /// or kinds, naming the state.
  torch::Tensor compute();
  /// Puts every state back to its initial value.
  void reset();
  /// Combine over `group` instead of the run's process group (none: do not
  /// combine).
  void set_process_group(c10::intrusive_ptr<c10d::ProcessGroup> group);

 protected:
  /// Registers a state. kCat states are 1-D and grow by concatenation
  /// (append()); the others keep `initial`'s shape.
  void add_state(const std::string& name, torch::Tensor initial, Reduction reduction);
  /// The state `name` (this rank's, or the combined one inside compute_value).
  torch::Tensor& state(const std::string& name);
  /// Appends `values` (flattened) to the kCat state `name`.
  void append(const std::string& name, const torch::Tensor& values);
  /// The value from the combined states.
  virtual torch::Tensor compute_value() = 0;

 private:
  struct State {
    torch::Tensor initial;
    torch::Tensor value;
    Reduction reduction;
  };
  std::map<std::string, State> states_;
  bool group_set_ = false;
  c10::intrusive_ptr<c10d::ProcessGroup> group_;
};

/// The fraction of samples whose highest score is the target (top-1
/// accuracy). update() takes scores [batch, classes] and targets [batch].
class Accuracy : public Metric {
 public:
  Accuracy();
  /// Throws std::invalid_argument when the shapes do not fit.
  void update(const torch::Tensor& scores, const torch::Tensor& target);

 protected:
  torch::Tensor compute_value() override;
};

/// The weighted mean of the values given (torchmetrics' MeanMetric).
class MeanMetric : public Metric {
 public:
  MeanMetric();
  /// Adds `value` (any shape: each element) with `weight` each.
  void update(const torch::Tensor& value, double weight = 1.0);

 protected:
  torch::Tensor compute_value() override;
};

}  // namespace train
