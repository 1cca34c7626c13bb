#pragma once

// Asynchronous successive halving, one bracket, as Ray Tune's
// AsyncHyperBandScheduler makes its decisions: rungs at grace_period times
// powers of reduction_factor; a trial reaching a rung first is recorded there
// and stops when its score is below the 1 - 1/reduction_factor quantile of
// the scores recorded there before it; every trial stops at max_t.

#include <map>
#include <vector>

#include "tune/scheduler.h"

namespace trainrun::tune {

class Asha final : public Scheduler {
 public:
  explicit Asha(const TuneConfig& tune);

  Decision on_report(const TrialReport& report, const std::vector<TrialView>& trials) override;
  void on_trial_end(const TrialReport& last) override;
  nlohmann::json state() const override;
  void restore(const nlohmann::json& state) override;

  /// The rungs' milestones, highest first.
  std::vector<double> milestones() const;

 private:
  struct Rung {
    double milestone = 0;
    std::map<size_t, double> recorded;  // trial -> score (higher is better)
  };
  // Ray's _Bracket.on_result: records the score at the rung reached, and
  // whether it is below that rung's cutoff.
  Decision record(size_t trial, double time, double score);

  AshaConfig config_;
  std::string metric_;
  double sign_;              // 1 for max, -1 for min: scores are compared higher-is-better
  std::vector<Rung> rungs_;  // highest milestone first
};

}  // namespace trainrun::tune
