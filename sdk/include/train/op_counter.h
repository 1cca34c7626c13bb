#pragma once

#include <cstdint>
#include <map>
#include <string>

namespace train {

/// Counts the ATen operators dispatched at the top level (an operator called
/// from inside another is not counted) on every thread of the process, from
/// construction to destruction, through LibTorch's RecordFunction callbacks.
/// On a GPU each such operator is about one kernel launch or more, so the
/// count stands in on the CPU for the launches a training step costs:
///
///   train::OpCounter ops;
///   optimizer.step();
///   std::cout << ops.count() << " operators\n";
///
/// One counter at a time per process (std::logic_error otherwise); the counts
/// may be read from any thread. The callbacks cost a little on every operator
/// while a counter lives: use it to measure, not in a training run.
class OpCounter {
 public:
  /// Starts counting. Throws std::logic_error when another OpCounter lives.
  OpCounter();
  /// Stops counting.
  ~OpCounter();
  OpCounter(const OpCounter&) = delete;
  OpCounter& operator=(const OpCounter&) = delete;

  /// Top-level operators since construction or the last reset().
  int64_t count() const;
  /// The same, by operator name ("aten::add_", ...).
  std::map<std::string, int64_t> by_name() const;
  /// Starts the counts again from zero.
  void reset();

 private:
  uint64_t handle_;
};

}  // namespace train
