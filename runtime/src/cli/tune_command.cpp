#include "cli/tune_command.h"

#include <trainrun/error.h>
#include <trainrun/trainer.h>

#include <fcntl.h>
#include <signal.h>

#include <iostream>

#include "common/parent.h"
#include "tune/trial_channel.h"

namespace trainrun {
namespace {

using namespace std::chrono_literals;

// How long a trial waits for the tuner's verdict on a report before it goes
// on without one (the tuner answers at once; a stuck one must not hang it).
constexpr auto kVerdictWait = 120s;

Tuner* running_tuner = nullptr;
Trainer* running_trainer = nullptr;

void stop_tuner(int) {
  if (running_tuner != nullptr) running_tuner->stop();
}

// Trainer::stop() is one write() to an eventfd: safe in a handler.
void stop_trainer(int) {
  if (running_trainer != nullptr) running_trainer->stop();
}

}  // namespace

int exit_code(const Result& result) {
  // A plugin the workers could not load is a plugin error, as when the
  // controller refuses one.
  return !result.error                                          ? kExitOk
         : result.interrupted()                                 ? kExitInterrupted
         : result.error->kind == trainrun::FailureKind::kPlugin ? kExitUsage
                                                                : kExitFailed;
}

void add_tune_options(CLI::App& command, TuneArgs& args) {
  auto& tune = args.tune;
  command
      .add_option("--param", args.params,
                  "a hyperparameter of the config: KEY=grid:A,B,..., KEY=choice:A,B,..., "
                  "KEY=uniform:LOW:HIGH, KEY=loguniform:LOW:HIGH or KEY=randint:LOW:HIGH "
                  "(repeatable)")
      ->required();
  command.add_option("--metric", tune.metric, "the reported metric that ranks trials")->required();
  command.add_option("--mode", args.mode, "max or min (default max)")
      ->check(CLI::IsMember({"max", "min"}));
  command
      .add_option("--num-samples", tune.num_samples,
                  "times the space is sampled, each with every grid value (default 1)")
      ->check(CLI::Range(1, 10000));
  command.add_option("--seed", tune.seed, "makes the sampled values the same every time")
      ->capture_default_str();
  command
      .add_option("--max-concurrent-trials", tune.max_concurrent_trials,
                  "trials at once (default: as many as the CPUs or GPUs hold)")
      ->check(CLI::NonNegativeNumber);
  command.add_option("--scheduler", args.scheduler, "fifo, asha or pbt (default fifo)")
      ->check(CLI::IsMember({"fifo", "asha", "pbt"}));
  auto time_attr = [&tune](const std::string& attr) {
    tune.asha.time_attr = attr;
    tune.pbt.time_attr = attr;
  };
  command.add_option_function<std::string>(
      "--time-attr", time_attr,
      "what measures a trial's progress for ASHA and PBT: training_iteration (its reports) or "
      "a reported metric such as epoch (default training_iteration)");
  command.add_option("--max-t", tune.asha.max_t, "ASHA: every trial stops here (default 100)");
  command.add_option("--grace-period", tune.asha.grace_period,
                     "ASHA: the first rung, before which no trial stops (default 1)");
  command.add_option("--reduction-factor", tune.asha.reduction_factor,
                     "ASHA: rungs this many times apart; the top 1/this go on (default 4)");
  command.add_option("--perturbation-interval", tune.pbt.perturbation_interval,
                     "PBT: how often a trial may copy a better one (default 1)");
  command.add_option("--quantile-fraction", tune.pbt.quantile_fraction,
                     "PBT: the bottom fraction copies the top fraction (default 0.25)");
  command.add_option("--resample-probability", tune.pbt.resample_probability,
                     "PBT: the chance a copied value is drawn again, not perturbed (default 0.25)");
  command.add_option("--mutation", tune.pbt.mutations,
                     "PBT: a key of the space to perturb (repeatable; default all but grids)");
}

int run_tune(TrainerOptions trainer, TuneArgs args) {
  ParamSpace space;
  for (const auto& param : args.params) {
    const auto equals = param.find('=');
    if (equals == std::string::npos || equals == 0) {
      throw UsageError("--param takes KEY=DOMAIN; got '" + param.substr(0, 64) + "'");
    }
    const auto key = param.substr(0, equals);
    if (space.count(key) != 0) throw UsageError("--param " + key + " is given twice");
    space[key] = Domain::parse(std::string_view(param).substr(equals + 1));
  }
  args.tune.max = args.mode == "max";
  args.tune.scheduler = args.scheduler == "asha"  ? SchedulerKind::kAsha
                        : args.scheduler == "pbt" ? SchedulerKind::kPbt
                                                  : SchedulerKind::kFifo;
  Tuner tuner(std::move(trainer), std::move(space), std::move(args.tune));
  running_tuner = &tuner;
  struct sigaction action {};
  action.sa_handler = stop_tuner;
  sigemptyset(&action.sa_mask);
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) ::sigaction(sig, &action, nullptr);
  ::signal(SIGPIPE, SIG_IGN);
  auto grid = tuner.fit();
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) ::signal(sig, SIG_DFL);
  running_tuner = nullptr;
  std::cout << "results: " << grid.path.string() << " (trainrun results " << grid.path.string()
            << ")" << std::endl;
  bool pending = false;
  for (const auto& t : grid.trials) {
    pending = pending || t.status == TrialStatus::kPending || t.status == TrialStatus::kRunning;
  }
  if (pending) return kExitInterrupted;
  return grid.num_errors() == static_cast<int>(grid.trials.size()) ? kExitFailed : kExitOk;
}

int run_trial() {
  // The trial's workers must not hold the channel: its end is the tuner's
  // sign that this process is gone.
  if (::fcntl(tune::kTrialChannelFd, F_SETFD, FD_CLOEXEC) != 0) {
    std::cerr << "trainrun trial: no channel from a tuner (descriptor 3)\n";
    return kExitUsage;
  }
  // The tuner's death ends this process group at once (SIGHUP, common/parent.h):
  // a rerun of the experiment finds the trial's run free.
  die_with_parent();
  tune::LineChannel channel{Fd(tune::kTrialChannelFd)};
  auto first = channel.receive(30s);
  if (!first || !first->contains("options")) {
    std::cerr << "trainrun trial: the tuner sent no options\n";
    return kExitUsage;
  }
  TrainerOptions options = (*first)["options"].get<TrainerOptions>();
  options.handle_signals = false;  // SIGHUP stays the death signal; SIGINT and SIGTERM below
  std::vector<std::string> keys;
  if (auto k = first->find("keys"); k != first->end() && k->is_array()) {
    for (const auto& key : *k) {
      if (key.is_string()) keys.push_back(key.get<std::string>());
    }
  }
  // The workers fall silent for the controller's heartbeat timeout at most:
  // a verdict is waited for half of it.
  const auto verdict_wait = std::min<std::chrono::milliseconds>(
      kVerdictWait, std::max<std::chrono::milliseconds>(options.run.heartbeat_timeout / 2, 50ms));
  Callbacks callbacks;
  callbacks.should_stop = [&](const ReportRecord& r) -> std::optional<std::string> {
    // Only what the scheduler reads: a report may carry megabytes of metrics.
    nlohmann::json metrics = nlohmann::json::object();
    if (r.metrics.is_object()) {
      for (const auto& key : keys) {
        if (auto m = r.metrics.find(key); m != r.metrics.end()) metrics[key] = *m;
      }
    }
    const nlohmann::json report = {{"iteration", r.iteration},
                                   {"metrics", metrics},
                                   {"checkpoint", r.checkpoint},
                                   {"time_total_s", r.time_total_s},
                                   {"timestamp", r.timestamp}};
    try {
      channel.send({{"report", report}}, 10s);
    } catch (const IoError&) {
      return std::string("stopped: the tuner is gone");
    }
    const auto deadline = std::chrono::steady_clock::now() + verdict_wait;
    while (true) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      auto verdict = channel.receive(std::max(left, 0ms));
      if (!verdict) {
        if (channel.eof()) return std::string("stopped: the tuner is gone");
        std::cerr << "trainrun trial: no verdict from the tuner on report " << r.iteration
                  << " in time; going on\n";
        return std::nullopt;
      }
      // A verdict that came too late for an earlier report is dropped.
      if (verdict->value("iteration", nlohmann::json()) != nlohmann::json(r.iteration)) continue;
      if (verdict->value("verdict", "") != "stop") return std::nullopt;
      const auto reason = verdict->value("reason", nlohmann::json());
      return reason.is_string() ? reason.get<std::string>() : std::string("stopped by the tuner");
    }
  };
  callbacks.on_checkpoint = [&channel](const CheckpointInfo& checkpoint) {
    try {
      channel.send({{"checkpoint", checkpoint.name}}, 1s);
    } catch (const IoError&) {  // the tuner is gone: the next report says so
    }
  };
  Trainer trainer(std::move(options), std::move(callbacks));
  running_trainer = &trainer;
  struct sigaction action {};
  action.sa_handler = stop_trainer;
  sigemptyset(&action.sa_mask);
  for (int sig : {SIGINT, SIGTERM}) ::sigaction(sig, &action, nullptr);
  ::signal(SIGPIPE, SIG_IGN);
  return exit_code(trainer.fit());
}

}  // namespace trainrun
