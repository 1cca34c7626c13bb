#pragma once

// Population Based Training, as Ray Tune's PopulationBasedTraining decides
// (asynchronously): each perturbation_interval of a trial's time_attr, it
// records the trial's score; a trial then in the bottom quantile_fraction of
// the running trials with a score takes the latest checkpoint of one of the
// top fraction, chosen at random, and that trial's hyperparameters, explored
// (x 1.2 or x 0.8, a neighbour in a list, or at resample_probability drawn
// again).

#include <map>
#include <vector>

#include "tune/random.h"
#include "tune/scheduler.h"

namespace trainrun::tune {

class Pbt final : public Scheduler {
 public:
  Pbt(const TuneConfig& tune, const ParamSpace& space);

  Decision on_report(const TrialReport& report, const std::vector<TrialView>& trials) override;
  void on_trial_end(const TrialReport& last) override;
  nlohmann::json state() const override;
  void restore(const nlohmann::json& state) override;

  /// Ray's _explore: `config` with each mutated key perturbed or drawn again.
  nlohmann::json explore(const nlohmann::json& config);

 private:
  struct TrialState {
    double last_perturbation = 0;
    std::optional<double> last_score;  // higher is better
    bool ended = false;
  };

  PbtConfig config_;
  std::string metric_;
  double sign_;
  ParamSpace mutations_;
  Random random_;
  std::map<size_t, TrialState> trials_;
};

}  // namespace trainrun::tune
