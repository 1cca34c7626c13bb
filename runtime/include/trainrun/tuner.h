#pragma once

// Hyperparameter search over runs (Ray Tune's Tuner for a TorchTrainer): a
// search space over the run's config, trials packed on this host's CPUs (or
// GPUs), schedulers that stop poor trials early (ASHA) or copy good ones
// (Population Based Training), and an experiment that resumes after a crash.
//
// Each trial is a run of its own, in a `trainrun` process of its own, with
// its run directory under the experiment's: <storage_path>/<name>/trial_NNNN.
// The experiment's record, experiment.json beside them, holds every trial's
// hyperparameters, status and best metric, and the scheduler's state. Running
// the same experiment again (same storage path and name) resumes it: finished
// trials are kept, the others go on from their latest checkpoints.

#include <trainrun/options.h>
#include <trainrun/result.h>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace trainrun {

/// One hyperparameter's values (Ray Tune's tune.grid_search, choice, uniform,
/// loguniform, randint).
struct Domain {
  enum class Kind { kGrid, kChoice, kUniform, kLogUniform, kRandInt };
  Kind kind = Kind::kChoice;
  nlohmann::json values = nlohmann::json::array();  // grid and choice
  double low = 0;                                   // uniform, loguniform, randint
  double high = 0;                                  // exclusive for randint, as Ray's

  /// Every value, each in its own trials (the trials are the product of all grids).
  static Domain grid(nlohmann::json values);
  /// One of the values, at random.
  static Domain choice(nlohmann::json values);
  static Domain uniform(double low, double high);
  /// Uniform in log space; 0 < low < high.
  static Domain loguniform(double low, double high);
  /// An integer in [low, high).
  static Domain randint(int64_t low, int64_t high);
  /// The command line's form, "grid:1,2,3", "choice:a,b", "uniform:0:1",
  /// "loguniform:1e-4:1e-1" or "randint:1:10" (a list's items are JSON where
  /// they parse as JSON, else strings). Throws UsageError in one line.
  static Domain parse(std::string_view text);
  /// The same form back.
  std::string to_string() const;
};

/// Config keys to their domains; every other key of the trials' config is
/// TrainerOptions::config's.
using ParamSpace = std::map<std::string, Domain>;

/// Asynchronous successive halving (Ray Tune's ASHAScheduler, one bracket):
/// at each rung (grace_period, x reduction_factor, ... below max_t) a trial
/// whose metric is below the rung's 1 - 1/reduction_factor quantile of the
/// trials recorded there stops; every trial stops at max_t.
struct AshaConfig {
  /// What measures a trial's progress: "training_iteration" (its reports, from
  /// 1) or a reported metric such as "epoch".
  std::string time_attr = "training_iteration";
  double max_t = 100;
  double grace_period = 1;
  double reduction_factor = 4;
};

/// Population Based Training (Ray Tune's PopulationBasedTraining): every
/// perturbation_interval of time_attr, a trial in the bottom quantile_fraction
/// stops and starts again from the latest checkpoint of one in the top
/// fraction, with its hyperparameters perturbed (x 1.2 or x 0.8, a neighbour
/// in a list) or, at resample_probability, drawn again.
struct PbtConfig {
  std::string time_attr = "training_iteration";
  double perturbation_interval = 1;
  double quantile_fraction = 0.25;
  double resample_probability = 0.25;
  /// The keys of the search space that are perturbed; empty = all but grids.
  std::vector<std::string> mutations;
};

enum class SchedulerKind { kFifo, kAsha, kPbt };

/// Ray Tune's TuneConfig.
struct TuneConfig {
  /// The reported metric that ranks trials (and that ASHA and PBT compare).
  std::string metric;
  /// Whether a higher metric is better ("max") or a lower one ("min").
  bool max = true;
  /// Times the search space is sampled (each sample with every grid value).
  int num_samples = 1;
  /// Makes the sampled values, and PBT's choices, the same every time.
  uint64_t seed = 0;
  /// Trials at once; 0 = as many as the CPUs (or GPUs) hold.
  int max_concurrent_trials = 0;
  SchedulerKind scheduler = SchedulerKind::kFifo;
  AshaConfig asha;
  PbtConfig pbt;
};

/// Where a trial stands in the experiment (Ray Tune's PENDING, RUNNING,
/// TERMINATED, ERROR): finished ran to its end; stopped was ended by the
/// scheduler (its checkpoints kept); failed ended with an error after its
/// retries.
enum class TrialStatus { kPending, kRunning, kFinished, kStopped, kFailed };
std::string_view to_string(TrialStatus status);

/// One trial, as the experiment records it and as its run left it.
struct TrialResult {
  std::string name;       // trial_0000: its run directory's name
  nlohmann::json config;  // its hyperparameters (the search space's keys), as it last ran
  TrialStatus status = TrialStatus::kPending;
  std::string note;  // why it stopped or failed, and PBT's copies
  int64_t iterations = 0;
  /// Its best value of the experiment's metric, and the report that made it.
  std::optional<double> best;
  int64_t best_iteration = 0;
  /// What its run left (load_result); path is empty for a trial never started.
  Result result;
};

/// What an experiment left (Ray Tune's ResultGrid).
struct ResultGrid {
  std::filesystem::path path;  // the experiment's directory
  std::string metric;
  bool max = true;
  std::vector<TrialResult> trials;  // in the order they were made
  /// The trial with the best value of `metric` (default: the experiment's),
  /// "max" or "min" (default: the experiment's), over every report of each
  /// trial; nullptr when no trial reported it.
  const TrialResult* best(std::string_view metric = {}, std::string_view mode = {}) const;
  /// Its best checkpoint by that metric (the reports that committed one), or empty.
  std::filesystem::path best_checkpoint(std::string_view metric = {},
                                        std::string_view mode = {}) const;
  int num_errors() const;
};

/// Reads an experiment's directory: experiment.json and each trial's run.
/// Throws UsageError if the directory holds no experiment, IoError if its
/// record is unreadable.
ResultGrid load_experiment(const std::filesystem::path& dir);

/// The table `trainrun results EXPERIMENT` prints: every trial's status,
/// hyperparameters, iterations and best metric, then the best trial and its
/// best checkpoint.
std::string describe(const ResultGrid& grid);

/// The experiment's page (report.html in its directory, written as it goes):
/// each trial's curve of the metric, the table of trials. Atomic; throws as
/// write_html_report does.
void write_experiment_report(const std::filesystem::path& dir, const std::filesystem::path& file);

/// What a host program hears of an experiment, on the thread that runs fit().
struct TuneCallbacks {
  /// A trial's status changed (started, stopped, finished, failed, copied by PBT).
  std::function<void(const TrialResult&)> on_trial;
  /// Each line the experiment would print (its events, its table of trials)
  /// instead of stdout.
  std::function<void(std::string_view line)> on_output;
};

class Tuner {
 public:
  /// `trainer` is every trial's: its config the fixed values, its run's
  /// storage path and name the experiment's; its scaling, checkpoints and
  /// failures each trial's. Throws UsageError on a bad value (one line).
  Tuner(TrainerOptions trainer, ParamSpace space, TuneConfig tune, TuneCallbacks callbacks = {});
  ~Tuner();
  Tuner(const Tuner&) = delete;
  Tuner& operator=(const Tuner&) = delete;

  /// Runs (or resumes) the experiment to its end. Throws UsageError (a
  /// search space unlike the record's) or IoError (storage).
  ResultGrid fit();

  /// Ends the fit() in progress: every running trial is interrupted (kept to
  /// resume), and fit() returns. Safe from any thread and a signal handler.
  void stop();

 private:
  struct State;
  TrainerOptions trainer_;
  ParamSpace space_;
  TuneConfig tune_;
  TuneCallbacks callbacks_;
  std::shared_ptr<State> state_;
};

}  // namespace trainrun
