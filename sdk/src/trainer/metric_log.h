#pragma once

// What LightningModule::log collects between two averages: per name, the sum
// of value x weight and the sum of weights over the epoch (or validation
// run), and the latest step's value. Averages across ranks go through
// sum_across_ranks: one check that the ranks logged the same names, one
// allreduce for all of them. Owned by one Trainer; used on its thread only.

#include <train/trainer.h>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/serialize/archive.h>

#include <map>
#include <string>
#include <vector>

namespace train::detail {

/// Σ value·n and Σ n of one metric on one rank.
struct WeightedSum {
  double sum = 0;
  double count = 0;
};

/// Σ sum and Σ count of each name over every rank of `group` (none: this
/// rank's alone). Every rank must pass the same names in the same order;
/// when one does not, every rank throws std::runtime_error naming each rank's
/// names that differ from rank 0's. A collective when `group` has more than
/// one rank: an allgather of 16 bytes per rank, then one allreduce of two
/// doubles per name.
std::vector<WeightedSum> sum_across_ranks(c10d::ProcessGroup* group, torch::Device device,
                                          const std::vector<std::string>& names,
                                          const std::vector<WeightedSum>& sums);

/// One stage's logged values (training, or validation).
class MetricLog {
 public:
  /// Adds one logged value (`tensor`, when not null, else `value`) with
  /// weight `weight`. Throws std::invalid_argument when `name` was logged
  /// before with other options.
  void add(const std::string& name, const torch::Tensor* tensor, double value, double weight,
           bool on_step, bool on_epoch, bool prog_bar, bool sync_dist);

  enum class Which { kStep, kEpoch, kBoth };
  /// Averages by reported name: the epoch's of every on_epoch value ("x", or
  /// "x_epoch" when it is on_step too) and the latest step's of every on_step
  /// value ("x", or "x_step"), as `which` asks. A collective (see
  /// sum_across_ranks) on `group`, even with nothing logged; a name
  /// that no rank logged since the last clear() has no value.
  std::map<std::string, double> values(c10d::ProcessGroup* group, torch::Device device,
                                       Which which);
  /// Whether any value was logged with prog_bar and on_step.
  bool has_prog_bar() const;
  /// Whether `reported` (a name as step_values gives it) was logged with prog_bar.
  bool is_prog_bar(const std::string& reported) const;
  /// Forgets everything logged (at the start of an epoch or validation run).
  void clear();
  /// Keeps the names and what they are, with nothing summed: a rank that
  /// joins in an epoch's middle averages its own batches from there.
  void zero_sums();

  /// This rank's epoch sums so far (with their options), and a resume's
  /// return of them: the next add() of each name goes on from its saved sum.
  void save(torch::serialize::OutputArchive& archive) const;
  void load(torch::serialize::InputArchive& archive);

 private:
  struct Entry {
    bool on_step = false, on_epoch = false, prog_bar = false, sync_dist = false;
    double host_sum = 0;       // of values given as numbers
    torch::Tensor device_sum;  // of tensors, where they live (no copy per step)
    double count = 0;
    double step_value = 0;
    torch::Tensor step_tensor;
    double step_count = 0;
    bool restored = false;  // from load(), not logged since: takes new options
  };

  std::map<std::string, Entry> entries_;
};

}  // namespace train::detail
