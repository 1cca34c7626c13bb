#pragma once

// Trial schedulers: what a trial does after each of its reports. A scheduler
// is a function of the reports it has been given and its state, which it
// hands out as JSON for the experiment's record and takes back on a resume;
// it starts nothing and reads no clock, so a test drives it in microseconds.

#include <trainrun/tuner.h>

#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace trainrun::tune {

/// One report of a running trial.
struct TrialReport {
  size_t trial = 0;
  int64_t iteration = 0;  // the trial's reports so far, this one included (from 1)
  nlohmann::json metrics;
};

/// What a scheduler knows of every trial when it decides.
struct TrialView {
  bool running = false;
  bool has_checkpoint = false;  // a committed checkpoint another trial could take
  nlohmann::json config;        // its hyperparameters
};

struct Decision {
  enum class Action { kContinue, kStop, kExploit };
  Action action = Action::kContinue;
  std::string reason;     // a line for the record: why it stops or what it copies
  bool finished = false;  // kStop: the trial has done all it was to do (ASHA's max_t)
  size_t source = 0;      // kExploit: the trial whose latest checkpoint it takes ...
  nlohmann::json config;  // ... and its new hyperparameters
};

class Scheduler {
 public:
  virtual ~Scheduler() = default;
  /// The decision for a report of a running trial.
  virtual Decision on_report(const TrialReport& report, const std::vector<TrialView>& trials) = 0;
  /// A trial ran to its end; `last` is its last report (metrics null: none).
  virtual void on_trial_end(const TrialReport& last) { (void)last; }
  virtual nlohmann::json state() const = 0;
  /// Takes back what state() gave. Throws IoError when it is malformed.
  virtual void restore(const nlohmann::json& state) = 0;
};

/// The scheduler `tune` names, for the trials of `space`. Throws UsageError
/// on a bad setting (one line).
std::unique_ptr<Scheduler> make_scheduler(const TuneConfig& tune, const ParamSpace& space);

/// A trial's name and its run directory's: trial_0000, trial_0001, ...
std::string trial_name(size_t trial);

/// A report's value of `attr` ("training_iteration": its iteration), if numeric.
std::optional<double> report_value(const TrialReport& report, const std::string& attr);

/// numpy's nanpercentile with linear interpolation; `values` is not empty.
double percentile(std::vector<double> values, double q);

}  // namespace trainrun::tune
