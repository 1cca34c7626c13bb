// The Tuner: an experiment's trials, each a `trainrun trial` process running
// one run, packed on this host's CPUs (or GPUs); their reports go through the
// scheduler, whose verdict each trial waits for; the record is replaced after
// every change, so that the same experiment run again resumes.

#include <trainrun/error.h>
#include <trainrun/tuner.h>

#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <ctime>
#include <deque>
#include <iostream>
#include <map>
#include <optional>
#include <regex>
#include <thread>
#include <utility>

#include "api/experiment_table.h"
#include "api/report_page.h"
#include "common/fd.h"
#include "common/paths.h"
#include "plugin/plugin_file.h"
#include "storage/run_directory.h"
#include "storage/s3_config.h"
#include "tune/experiment.h"
#include "tune/scheduler.h"
#include "tune/search_space.h"
#include "tune/trial_process.h"

namespace trainrun {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

// How long a trial's process may take to exit once its channel closed, or
// once asked to stop, before it is killed.
constexpr auto kExitWait = 60s;
// The live table of trials, at most this often.
constexpr auto kTableEvery = 30s;
// report.html, at most this often while the experiment runs.
constexpr auto kPageEvery = 30s;

double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  ::gmtime_r(&now, &tm);
  char text[32];
  std::strftime(text, sizeof(text), "%Y-%m-%d_%H-%M-%S", &tm);
  return text;
}

int usable_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1L, ::sysconf(_SC_NPROCESSORS_ONLN));
}

// The GPUs trials may take, as CUDA_VISIBLE_DEVICES names them: that
// variable's list, else one per device the NVIDIA driver lists.
std::vector<std::string> visible_gpus() {
  std::vector<std::string> gpus;
  if (const char* visible = std::getenv("CUDA_VISIBLE_DEVICES")) {
    std::string list(visible);
    size_t start = 0;
    while (start <= list.size()) {
      auto comma = list.find(',', start);
      auto item =
          list.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
      if (!item.empty()) gpus.push_back(item);
      if (comma == std::string::npos) break;
      start = comma + 1;
    }
    return gpus;
  }
  std::error_code ec;
  size_t count = 0;
  for (auto it = std::filesystem::directory_iterator("/proc/driver/nvidia/gpus", ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
    ++count;
  }
  for (size_t i = 0; i < count; ++i) gpus.push_back(std::to_string(i));
  return gpus;
}

json search_record(const ParamSpace& space, const TuneConfig& tune) {
  json scheduler;
  switch (tune.scheduler) {
    case SchedulerKind::kFifo: scheduler = {{"kind", "fifo"}}; break;
    case SchedulerKind::kAsha:
      scheduler = {{"kind", "asha"},
                   {"time_attr", tune.asha.time_attr},
                   {"max_t", tune.asha.max_t},
                   {"grace_period", tune.asha.grace_period},
                   {"reduction_factor", tune.asha.reduction_factor}};
      break;
    case SchedulerKind::kPbt:
      scheduler = {{"kind", "pbt"},
                   {"time_attr", tune.pbt.time_attr},
                   {"perturbation_interval", tune.pbt.perturbation_interval},
                   {"quantile_fraction", tune.pbt.quantile_fraction},
                   {"resample_probability", tune.pbt.resample_probability},
                   {"mutations", tune.pbt.mutations}};
      break;
  }
  return {{"space", tune::space_to_json(space)},
          {"num_samples", tune.num_samples},
          {"seed", tune.seed},
          {"metric", tune.metric},
          {"mode", tune.max ? "max" : "min"},
          {"scheduler", scheduler}};
}

const std::regex& checkpoint_name() {
  static const std::regex kName("checkpoint_[0-9]{1,12}");
  return kName;
}

}  // namespace

struct Tuner::State {
  Fd stop_fd{::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)};
  std::atomic<bool> running{false};
};

Tuner::Tuner(TrainerOptions trainer, ParamSpace space, TuneConfig tune, TuneCallbacks callbacks)
    : trainer_(std::move(trainer)),
      space_(std::move(space)),
      tune_(std::move(tune)),
      callbacks_(std::move(callbacks)),
      state_(std::make_shared<State>()) {
  if (!state_->stop_fd) throw IoError("cannot make an eventfd for Tuner::stop");
  if (tune_.metric.empty()) throw UsageError("a tuner needs a metric (--metric)");
  if (tune_.num_samples < 1) throw UsageError("num_samples must be at least 1");
  if (tune_.max_concurrent_trials < 0) throw UsageError("max_concurrent_trials must be 0 or more");
  if (space_.empty()) throw UsageError("a tuner needs a search space (--param KEY=DOMAIN)");
  tune::check_space(space_);
  (void)tune::make_scheduler(tune_, space_);  // its settings checked now
  if (trainer_.plugin.empty()) throw UsageError("--plugin is required");
  if (!trainer_.network.listen.empty()) {
    throw UsageError("a tuner runs its trials on this host: --listen is not supported");
  }
  if (trainer_.scaling.in_process) throw UsageError("a tuner cannot run trials with --local");
  if (s3::is_s3_url(trainer_.run.storage_path.string())) {
    throw UsageError("a tuner keeps its experiment on a local filesystem: not " +
                     trainer_.run.storage_path.string());
  }
  if (!trainer_.config.is_object()) throw UsageError("the trials' config must be a JSON object");
  auto& run = trainer_.run;
  if (run.name.empty()) run.name = "tune-" + utc_now();
  if (run.name.find('/') != std::string::npos || run.name == "." || run.name == "..") {
    throw UsageError("experiment name '" + run.name + "' must not contain '/'");
  }
  if (run.storage_path.empty()) {
    const char* home = std::getenv("HOME");
    run.storage_path = std::filesystem::path(home != nullptr ? home : ".") / "trainrun_results";
  }
  run.storage_path = std::filesystem::absolute(run.storage_path);
  trainer_.plugin = std::filesystem::absolute(trainer_.plugin);
  if (!trainer_.worker_executable.empty()) {
    trainer_.worker_executable = std::filesystem::absolute(trainer_.worker_executable);
  }
}

Tuner::~Tuner() = default;

void Tuner::stop() {
  const uint64_t one = 1;
  [[maybe_unused]] auto n = ::write(state_->stop_fd.get(), &one, sizeof(one));
}

namespace {

// One fit(): the record, the running trials and the scheduler.
class Experiment {
 public:
  Experiment(const TrainerOptions& trainer, const ParamSpace& space, const TuneConfig& tune,
             const TuneCallbacks& callbacks, int stop_fd)
      : trainer_(trainer),
        space_(space),
        tune_(tune),
        callbacks_(callbacks),
        stop_fd_(stop_fd),
        dir_(trainer.run.storage_path / trainer.run.name),
        scheduler_(tune::make_scheduler(tune, space)) {}
  Experiment(const Experiment&) = delete;
  Experiment& operator=(const Experiment&) = delete;
  /// Whatever ended run() (an exception among them), no trial process outlives it.
  ~Experiment() { end_trials(); }

  ResultGrid run();

 private:
  struct Running {
    tune::TrialProcess process;
    std::vector<std::string> gpus;
    bool signalled = false;  // SIGTERM sent
    std::optional<Clock::time_point> exit_by;
  };

  void open_record();
  void save(bool sync = true);
  void say(const std::string& line);
  void trial_event(size_t index, const std::string& what);
  int capacity();
  void start(size_t index);
  void on_messages(size_t index, Running& running);
  tune::Decision on_report(size_t index, const json& report);
  void on_exit(size_t index, Running& running, int code);
  // Carries out a trial's recorded verdict once its process is gone; returns
  // what it did, for the trial's line.
  std::string carry_out_verdict(tune::TrialRecord& t);
  // A PBT copy that has a checkpoint of its own past the copy goes on from it.
  void settle_resume_from(tune::TrialRecord& t, const Result& result);
  void stop_all();
  void end_trials();
  std::vector<tune::TrialView> views() const;
  std::optional<size_t> next_pending() const;
  void print_table();
  void write_page(bool force);

  const TrainerOptions& trainer_;
  const ParamSpace& space_;
  const TuneConfig& tune_;
  const TuneCallbacks& callbacks_;
  int stop_fd_;
  std::filesystem::path dir_;
  std::unique_ptr<tune::Scheduler> scheduler_;
  std::unique_ptr<run_directory::RunLock> lock_;
  tune::ExperimentRecord record_;
  std::filesystem::path trainrun_;
  std::map<size_t, Running> running_;
  std::vector<std::string> free_gpus_;
  int cpus_per_worker_ = 1;
  bool stopping_ = false;
  Clock::time_point next_table_ = Clock::now() + kTableEvery;
  Clock::time_point next_page_ = Clock::now();
};

void Experiment::say(const std::string& line) {
  if (callbacks_.on_output) {
    try {
      callbacks_.on_output(line);
    } catch (...) {  // a host's callback cannot end the experiment
    }
  } else if (trainer_.verbose) {
    std::cout << line << std::endl;
  }
}

void Experiment::save(bool sync) {
  record_.scheduler_state = scheduler_->state();
  tune::write_experiment(dir_, record_, sync);
}

void Experiment::settle_resume_from(tune::TrialRecord& t, const Result& result) {
  if (t.resume_from.empty()) return;
  for (auto it = result.history.rbegin(); it != result.history.rend(); ++it) {
    if (it->checkpoint.empty()) continue;
    if (it->iteration > t.resume_after) {
      t.resume_from.clear();
      t.latest_checkpoint = (dir_ / t.name / it->checkpoint).string();
    }
    return;
  }
}

std::string Experiment::carry_out_verdict(tune::TrialRecord& t) {
  const json verdict = std::exchange(t.verdict, json());
  t.note = verdict.value("reason", std::string());
  if (verdict.value("action", "") == "fail") {  // its channel broke
    t.status = TrialStatus::kFailed;
    return "failed: " + t.note;
  }
  if (verdict.value("action", "") == "exploit") {
    t.config = verdict.value("config", t.config);
    t.resume_from = verdict.value("checkpoint", std::string());
    t.resume_after = t.iterations;
    t.status = TrialStatus::kPending;
    return "starts again from " + t.resume_from;
  }
  if (verdict.value("finished", false)) {
    t.status = TrialStatus::kFinished;
    return "finished: " + t.note;
  }
  t.status = TrialStatus::kStopped;
  return "stopped";
}

void Experiment::open_record() {
  std::filesystem::create_directories(dir_ / "logs");
  lock_ = std::make_unique<run_directory::RunLock>(dir_);
  json search = search_record(space_, tune_);
  search["config"] = trainer_.config;
  if (auto earlier = tune::read_experiment(dir_)) {
    if (earlier->search != search) {
      throw UsageError("experiment " + dir_.string() +
                       " was made with another search space, config, sample count, seed, metric "
                       "or scheduler: give this one another --name");
    }
    record_ = std::move(*earlier);
    if (!record_.scheduler_state.empty()) scheduler_->restore(record_.scheduler_state);
    size_t resumed = 0;
    for (auto& trial : record_.trials) {
      if (trial.status != TrialStatus::kRunning) continue;
      std::optional<Result> result;
      try {
        result = load_result(dir_ / trial.name);
      } catch (const std::exception&) {  // it never wrote a record: it starts again
      }
      if (result) {
        trial.iterations = std::max(trial.iterations, result->iterations);
        settle_resume_from(trial, *result);
      }
      // A verdict given before the tuner died is carried out now.
      if (!trial.verdict.is_null()) {
        carry_out_verdict(trial);
      } else {
        trial.status = TrialStatus::kPending;
      }
      resumed += trial.status == TrialStatus::kPending;
    }
    say("tune: resuming " + dir_.string() + ": " + std::to_string(resumed) +
        " trials go on from their latest checkpoints");
  } else {
    record_.name = trainer_.run.name;
    record_.search = search;
    record_.started_at = unix_now();
    const auto configs = tune::make_trials(space_, tune_.num_samples, tune_.seed);
    for (size_t i = 0; i < configs.size(); ++i) {
      tune::TrialRecord trial;
      trial.name = tune::trial_name(i);
      trial.config = configs[i];
      record_.trials.push_back(std::move(trial));
    }
  }
  record_.status = "running";
  save();
}

int Experiment::capacity() {
  const int workers = std::max(1, trainer_.scaling.num_workers);
  cpus_per_worker_ = trainer_.scaling.cpus_per_worker > 0 ? trainer_.scaling.cpus_per_worker : 1;
  const int cpus = usable_cpus();
  const int per_trial = workers * cpus_per_worker_;
  int slots = cpus / per_trial;
  if (slots < 1) {
    throw UsageError("a trial takes " + std::to_string(per_trial) + " CPUs (" +
                     std::to_string(workers) + " workers x " + std::to_string(cpus_per_worker_) +
                     "), more than the " + std::to_string(cpus) + " this host has");
  }
  if (trainer_.scaling.use_gpu) {
    free_gpus_ = visible_gpus();
    const int by_gpu = static_cast<int>(free_gpus_.size()) / workers;
    if (by_gpu < 1) {
      throw UsageError("a trial takes " + std::to_string(workers) + " GPUs; this host shows " +
                       std::to_string(free_gpus_.size()));
    }
    slots = std::min(slots, by_gpu);
  }
  if (tune_.max_concurrent_trials > 0) slots = std::min(slots, tune_.max_concurrent_trials);
  // PBT compares trials that run side by side; it pauses none to let others catch up.
  if (tune_.scheduler == SchedulerKind::kPbt && slots < 2) {
    throw UsageError("PBT needs at least 2 trials at once; this host holds " +
                     std::to_string(slots));
  }
  return slots;
}

std::vector<tune::TrialView> Experiment::views() const {
  std::vector<tune::TrialView> views;
  for (size_t i = 0; i < record_.trials.size(); ++i) {
    const auto& t = record_.trials[i];
    views.push_back(
        {running_.count(i) != 0 && t.verdict.is_null(), !t.latest_checkpoint.empty(), t.config});
  }
  return views;
}

std::optional<size_t> Experiment::next_pending() const {
  // A trial that ran before (PBT's copy, a resume) first: it holds progress.
  std::optional<size_t> fresh;
  for (size_t i = 0; i < record_.trials.size(); ++i) {
    const auto& t = record_.trials[i];
    if (t.status != TrialStatus::kPending || running_.count(i) != 0) continue;
    if (t.starts > 0) return i;
    if (!fresh) fresh = i;
  }
  return fresh;
}

void Experiment::trial_event(size_t index, const std::string& what) {
  const auto& t = record_.trials[index];
  say(t.name + " " + what);
  if (callbacks_.on_trial) {
    const TrialResult r = trial_result(t);
    try {
      callbacks_.on_trial(r);
    } catch (...) {  // a host's callback cannot end the experiment
    }
  }
}

void Experiment::start(size_t index) {
  auto& t = record_.trials[index];
  TrainerOptions options = trainer_;
  options.config = trainer_.config;
  for (const auto& [key, value] : t.config.items()) options.config[key] = value;
  options.run.storage_path = dir_;
  options.run.name = t.name;
  options.scaling.cpus_per_worker = cpus_per_worker_;
  options.verbose = false;
  options.status_line = false;
  options.handle_signals = false;  // the trial process routes its signals itself
  options.progress_interval = std::chrono::seconds(0);
  if (!t.resume_from.empty()) {
    options.run.resume_from = t.resume_from;
    options.run.resume_from_first = true;
  }
  // Recorded as running before its process exists: a record read at any
  // moment names every trial that may have started.
  const bool resumed = t.starts > 0;
  ++t.starts;
  if (t.started_at == 0) t.started_at = unix_now();
  t.ended_at = 0;
  t.status = TrialStatus::kRunning;
  save();
  std::vector<std::string> env;
  std::vector<std::string> gpus;
  if (trainer_.scaling.use_gpu) {
    const auto workers = static_cast<size_t>(std::max(1, trainer_.scaling.num_workers));
    gpus.assign(free_gpus_.begin(), free_gpus_.begin() + static_cast<std::ptrdiff_t>(workers));
    free_gpus_.erase(free_gpus_.begin(), free_gpus_.begin() + static_cast<std::ptrdiff_t>(workers));
    std::string list;
    for (const auto& g : gpus) list += (list.empty() ? "" : ",") + g;
    env.push_back("CUDA_VISIBLE_DEVICES=" + list);
  }
  std::optional<tune::TrialProcess> process;
  try {
    process.emplace(tune::spawn_trial(trainrun_, dir_ / "logs" / (t.name + ".log"), env));
    // The report's fields the scheduler reads: the rest stays in the trial's record.
    json keys = json::array({tune_.metric, tune_.asha.time_attr, tune_.pbt.time_attr});
    process->channel.send(json{{"options", options}, {"keys", keys}}, 10s);
  } catch (...) {
    if (process) {
      ::kill(process->pid, SIGKILL);
      ::waitpid(process->pid, nullptr, 0);
    }
    free_gpus_.insert(free_gpus_.end(), gpus.begin(), gpus.end());
    throw;
  }
  running_.emplace(index, Running{std::move(*process), std::move(gpus), false, {}});
  std::string values;
  for (const auto& [key, value] : t.config.items()) {
    values += (values.empty() ? "" : ", ") + key + "=" + value.dump();
  }
  trial_event(index, std::string(resumed ? "resumed: " : "started: ") + values +
                         (t.resume_from.empty() ? "" : " from " + t.resume_from));
}

tune::Decision Experiment::on_report(size_t index, const json& report) {
  auto& t = record_.trials[index];
  // The trial's bytes are untrusted: each field is taken only with its type.
  constexpr int64_t kMostIteration = int64_t{1} << 50;
  const auto iteration_field = report.find("iteration");
  const int64_t iteration =
      iteration_field != report.end() && iteration_field->is_number_integer()
          ? std::clamp<int64_t>(iteration_field->get<int64_t>(), 0, kMostIteration)
          : t.iterations + 1;
  const auto metrics_field = report.find("metrics");
  const json metrics =
      metrics_field != report.end() && metrics_field->is_object() ? *metrics_field : json::object();
  t.iterations = std::max<int64_t>(t.iterations, iteration);
  tune::TrialReport r{index, t.iterations, metrics};
  if (auto value = tune::report_value(r, tune_.metric)) {
    const bool better = !t.best || (tune_.max ? *value > *t.best : *value < *t.best);
    if (better) {
      t.best = *value;
      t.best_iteration = t.iterations;
    }
  }
  const auto checkpoint = report.find("checkpoint");
  if (checkpoint != report.end() && checkpoint->is_string() &&
      std::regex_match(checkpoint->get<std::string>(), checkpoint_name())) {
    t.latest_checkpoint = (dir_ / t.name / checkpoint->get<std::string>()).string();
    if (t.iterations > t.resume_after) t.resume_from.clear();  // its own is where it goes on
  }
  return scheduler_->on_report(r, views());
}

void Experiment::on_messages(size_t index, Running& running) {
  auto& t = record_.trials[index];
  std::vector<json> messages;
  try {
    messages = running.process.channel.drain();
  } catch (const IoError& e) {
    say(t.name + ": " + e.what() + "; it is stopped");
    t.verdict = {{"action", "fail"}, {"reason", e.what()}};
    save();
    ::kill(running.process.pid, SIGKILL);
    running.exit_by = Clock::now() + kExitWait;
    return;
  }
  for (const auto& message : messages) {
    // An asynchronous checkpoint, committed after its report.
    if (auto c = message.find("checkpoint"); c != message.end() && c->is_string()) {
      if (std::regex_match(c->get<std::string>(), checkpoint_name())) {
        t.latest_checkpoint = (dir_ / t.name / c->get<std::string>()).string();
      }
      continue;
    }
    auto it = message.find("report");
    if (it == message.end() || !it->is_object()) continue;
    const json iteration = it->value("iteration", json());
    json verdict = {{"verdict", "continue"}, {"iteration", iteration}};
    if (!t.verdict.is_null() || stopping_) {
      verdict["verdict"] = "stop";
      verdict["reason"] = t.verdict.is_null() ? std::string("the experiment stops")
                                              : t.verdict.value("reason", std::string());
      running.exit_by = Clock::now() + kExitWait;
    } else {
      auto decision = on_report(index, *it);
      using Action = tune::Decision::Action;
      if (decision.action != Action::kContinue) {
        verdict["verdict"] = "stop";
        verdict["reason"] = decision.reason;
        t.verdict = {{"action", decision.action == Action::kExploit ? "exploit" : "stop"},
                     {"reason", decision.reason},
                     {"finished", decision.finished}};
        if (decision.action == Action::kExploit) {
          // The source's checkpoint now, with the config explored from its values now.
          t.verdict["config"] = decision.config;
          t.verdict["checkpoint"] = record_.trials[decision.source].latest_checkpoint;
        }
        if (!decision.finished) say(t.name + " " + decision.reason);
        running.exit_by = Clock::now() + kExitWait;
      }
      // A verdict must survive the tuner; a report's counts need only survive its process.
      save(/*sync=*/decision.action != Action::kContinue);
    }
    try {
      running.process.channel.send(verdict, 10s);
    } catch (const IoError&) {  // it is gone: its exit says the rest
    }
  }
}

void Experiment::on_exit(size_t index, Running& running, int code) {
  auto& t = record_.trials[index];
  free_gpus_.insert(free_gpus_.end(), running.gpus.begin(), running.gpus.end());
  std::optional<Result> result;
  try {
    result = load_result(dir_ / t.name);
  } catch (const std::exception&) {  // it never wrote its record (a refused plugin)
  }
  if (result) {
    t.iterations = std::max(t.iterations, result->iterations);
    if (!result->checkpoint.empty()) t.latest_checkpoint = result->checkpoint.string();
    settle_resume_from(t, *result);
  }
  t.ended_at = unix_now();
  std::string what;
  if (!t.verdict.is_null()) {
    what = carry_out_verdict(t);
  } else if (code == 0) {
    t.status = TrialStatus::kFinished;  // a PBT copy's note stays
    what = "finished";
    tune::TrialReport last{index, t.iterations, result ? result->metrics : json()};
    scheduler_->on_trial_end(last);
  } else if (stopping_ && running.signalled) {
    t.status = TrialStatus::kPending;  // interrupted: it resumes with the experiment
    what = "interrupted";
  } else {
    t.status = TrialStatus::kFailed;
    t.note = result && result->error ? result->error->summary()
                                     : "its process exited with code " + std::to_string(code) +
                                           " (logs/" + t.name + ".log)";
    what = "failed: " + t.note;
  }
  save();
  std::string best;
  if (t.best) best = " (best " + tune_.metric + " " + json(*t.best).dump() + ")";
  trial_event(index, what + " after " + std::to_string(t.iterations) + " reports" + best);
}

void Experiment::stop_all() {
  if (stopping_) return;
  stopping_ = true;
  say("tune: stopping: every running trial is interrupted, to resume with this command again");
  for (auto& [index, running] : running_) {
    ::kill(running.process.pid, SIGTERM);
    running.signalled = true;
    running.exit_by = Clock::now() + kExitWait;
  }
}

// After an exception: each trial is asked to stop, then killed, and reaped.
void Experiment::end_trials() {
  if (running_.empty()) return;
  for (auto& [index, running] : running_) ::kill(running.process.pid, SIGTERM);
  const auto deadline = Clock::now() + 10s;
  while (!running_.empty()) {
    for (auto it = running_.begin(); it != running_.end();) {
      if (tune::try_reap(it->second.process.pid)) {
        it = running_.erase(it);
      } else {
        if (Clock::now() > deadline) ::kill(it->second.process.pid, SIGKILL);
        ++it;
      }
    }
    std::this_thread::sleep_for(50ms);
  }
}

void Experiment::print_table() {
  std::vector<TrialResult> trials;
  for (const auto& t : record_.trials) trials.push_back(trial_result(t));
  for (const auto& line : trial_table(trials, tune_.metric, tune_.max)) say(line);
}

void Experiment::write_page(bool force) {
  if (!force && Clock::now() < next_page_) return;
  next_page_ = Clock::now() + kPageEvery;
  try {
    write_experiment_report(dir_, dir_ / "report.html");
  } catch (const std::exception& e) {  // the record has everything; the page is extra
    say(std::string("tune: cannot write report.html: ") + e.what());
  }
}

ResultGrid Experiment::run() {
  (void)inspect_plugin_file(trainer_.plugin);  // a broken plugin, before any trial
  trainrun_ = find_trainrun_executable();
  const int slots = capacity();
  open_record();
  say("tune: " + std::to_string(record_.trials.size()) + " trials, " + std::to_string(slots) +
      " at once, in " + dir_.string());
  while (true) {
    while (!stopping_ && static_cast<int>(running_.size()) < slots) {
      auto next = next_pending();
      if (!next) break;
      try {
        start(*next);
      } catch (const IoError& e) {
        auto& t = record_.trials[*next];
        t.status = TrialStatus::kFailed;
        t.note = e.what();
        save();
        trial_event(*next, std::string("failed to start: ") + e.what());
      }
    }
    if (running_.empty()) break;
    std::vector<pollfd> fds{{stop_fd_, POLLIN, 0}};
    std::vector<size_t> order;
    for (auto& [index, running] : running_) {
      fds.push_back({running.process.channel.fd(), POLLIN, 0});
      order.push_back(index);
    }
    ::poll(fds.data(), fds.size(), 500);
    if (fds[0].revents & POLLIN) {
      uint64_t count = 0;
      [[maybe_unused]] auto n = ::read(stop_fd_, &count, sizeof(count));
      stop_all();
    }
    for (size_t i = 0; i < order.size(); ++i) {
      if (fds[i + 1].revents != 0) on_messages(order[i], running_.at(order[i]));
    }
    const auto now = Clock::now();
    for (auto it = running_.begin(); it != running_.end();) {
      auto& running = it->second;
      std::optional<int> code;
      if (running.process.channel.eof() || running.exit_by) {
        code = tune::try_reap(running.process.pid);
      }
      if (!code && running.process.channel.eof() && !running.exit_by) {
        running.exit_by = now + kExitWait;
      }
      if (!code && running.exit_by && now > *running.exit_by) {
        ::kill(running.process.pid, SIGKILL);
        running.exit_by = now + 5s;
      }
      if (code) {
        const size_t index = it->first;
        Running done = std::move(running);
        it = running_.erase(it);
        on_exit(index, done, *code);
      } else {
        ++it;
      }
    }
    if (Clock::now() >= next_table_) {
      next_table_ = Clock::now() + kTableEvery;
      print_table();
    }
    write_page(false);
  }
  record_.status = stopping_ ? "interrupted" : "finished";
  save();
  print_table();
  write_page(true);
  return load_experiment(dir_);
}

}  // namespace

ResultGrid Tuner::fit() {
  if (state_->running.exchange(true)) throw UsageError("this Tuner's fit() is already running");
  struct Done {
    std::atomic<bool>& running;
    ~Done() { running = false; }
  } done{state_->running};
  // A stop() before this fit() is forgotten.
  uint64_t count = 0;
  [[maybe_unused]] auto n = ::read(state_->stop_fd.get(), &count, sizeof(count));
  Experiment experiment(trainer_, space_, tune_, callbacks_, state_->stop_fd.get());
  auto grid = experiment.run();
  const auto* best = grid.best();
  if (best != nullptr && trainer_.verbose) {
    const auto checkpoint = grid.best_checkpoint();
    std::string line = "tune: best " + tune_.metric + " " + json(*best->best).dump() + ": " +
                       best->name + " " + best->config.dump() +
                       (checkpoint.empty() ? "" : ", checkpoint " + checkpoint.string());
    if (callbacks_.on_output) {
      callbacks_.on_output(line);
    } else {
      std::cout << line << std::endl;
    }
  }
  return grid;
}

}  // namespace trainrun
