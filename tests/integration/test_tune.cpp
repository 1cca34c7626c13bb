// Trials (`trainrun tune`): real trial processes, each a run of the test
// plugin's tune_trial, whose score is a function of its config and reports
// (each epoch adds q), so that what a scheduler must do is known.

#include <trainrun/tuner.h>

#include <doctest/doctest.h>
#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include "run_helpers.h"
#include "storage/run_directory.h"

namespace {

using json = nlohmann::json;

std::string tune_args(const std::string& name, const std::string& rest) {
  return std::string("tune --plugin '") + TEST_PLUGIN + "' --entry tune_trial --name " + name +
         " --metric score " + rest;
}

json experiment(const Sandbox& box, const std::string& name) {
  return read_json(box.run_dir(name) / "experiment.json");
}

std::vector<json> reports(const std::filesystem::path& run_dir) {
  std::vector<json> out;
  std::istringstream lines(read_text(run_dir / "result.jsonl"));
  for (std::string line; std::getline(lines, line);) {
    auto j = json::parse(line, nullptr, false);
    if (j.is_object() && j.contains("metrics")) out.push_back(j);
  }
  return out;
}

std::vector<std::string> event_lines(const std::filesystem::path& events,
                                     const std::string& trial) {
  std::vector<std::string> out;
  std::istringstream lines(read_text(events / trial));
  for (std::string line; std::getline(lines, line);) out.push_back(line);
  return out;
}

int usable_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  REQUIRE(::sched_getaffinity(0, sizeof(set), &set) == 0);
  return CPU_COUNT(&set);
}

// The most trial processes alive at once, from each run's controller start
// (its first report's timestamp less its time_total_s) to its last report.
int most_at_once(const Sandbox& box, const json& record) {
  std::vector<std::pair<double, int>> edges;
  for (const auto& t : record["trials"]) {
    auto r = reports(box.run_dir(record["name"].get<std::string>()) / t["name"].get<std::string>());
    if (r.empty()) continue;
    edges.emplace_back(
        r.front()["timestamp"].get<double>() - r.front()["time_total_s"].get<double>(), 1);
    edges.emplace_back(r.back()["timestamp"].get<double>(), -1);
  }
  std::sort(edges.begin(), edges.end());
  int now = 0;
  int most = 0;
  for (const auto& [time, change] : edges) most = std::max(most, now += change);
  return most;
}

// Until the kernel has stopped it (SIGSTOP is delivered asynchronously).
void wait_stopped(pid_t pid) {
  for (int i = 0; i < 1000; ++i) {
    const auto stat = read_text("/proc/" + std::to_string(pid) + "/stat");
    const auto close = stat.rfind(')');
    if (close == std::string::npos || stat.size() < close + 3 || stat[close + 2] == 'T') return;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

bool any_trial_held(const Sandbox& box, const json& record) {
  for (const auto& t : record["trials"]) {
    const auto dir = box.run_dir(record["name"].get<std::string>()) / t["name"].get<std::string>();
    if (trainrun::run_directory::is_held(dir)) return true;
  }
  return false;
}

}  // namespace

TEST_CASE("tune: a grid and random search runs every trial with its values, the same for a seed") {
  Sandbox box;
  const std::string space =
      "--param q=grid:1,2 --param lr=loguniform:0.001:0.1 --param width=randint:1:5 "
      "--param opt=choice:adam,sgd --num-samples 2 --seed 7 --config epochs=2";
  auto out = box.run(tune_args("search", space));
  INFO(out.output);
  REQUIRE(out.exit_code == 0);
  const auto record = experiment(box, "search");
  REQUIRE(record["trials"].size() == 4);
  std::vector<double> qs;
  for (const auto& t : record["trials"]) {
    const auto name = t["name"].get<std::string>();
    CHECK(t["status"] == "finished");
    CHECK(t["iterations"] == 2);
    const auto& c = t["config"];
    qs.push_back(c["q"].get<double>());
    CHECK(c["lr"].get<double>() >= 0.001);
    CHECK(c["lr"].get<double>() < 0.1);
    CHECK(c["width"].is_number_integer());
    CHECK(c["width"].get<int>() >= 1);
    CHECK(c["width"].get<int>() < 5);
    CHECK((c["opt"] == "adam" || c["opt"] == "sgd"));
    // The trial ran with those values, and the fixed ones.
    const auto run = read_json(box.run_dir("search") / name / "run.json");
    for (const auto& key : {"q", "lr", "width", "opt"}) CHECK(run["config"][key] == c[key]);
    CHECK(run["config"]["epochs"] == 2);
    const auto r = reports(box.run_dir("search") / name);
    REQUIRE(r.size() == 2);
    CHECK(r.back()["metrics"]["score"].get<double>() == doctest::Approx(2 * c["q"].get<double>()));
    CHECK(t["best"]["value"].get<double>() == doctest::Approx(2 * c["q"].get<double>()));
  }
  CHECK(qs == std::vector<double>{1, 2, 1, 2});
  // The draws differ between samples, and a second experiment with the seed makes the same.
  CHECK(record["trials"][0]["config"]["lr"] != record["trials"][2]["config"]["lr"]);
  REQUIRE(box.run(tune_args("again", space)).exit_code == 0);
  const auto again = experiment(box, "again");
  for (size_t i = 0; i < 4; ++i)
    CHECK(again["trials"][i]["config"] == record["trials"][i]["config"]);

  // trainrun results: the table, the best trial and its best checkpoint.
  auto results = box.run("results " + (box.run_dir("search")).string());
  INFO(results.output);
  CHECK(results.exit_code == 0);
  CHECK(results.output.find("Trials: 4, 4 finished") != std::string::npos);
  CHECK(results.output.find("best trial: trial_0001") != std::string::npos);
  CHECK(results.output.find("best checkpoint: " + (box.run_dir("search") / "trial_0001").string() +
                            "/checkpoint_") != std::string::npos);
  // And from C++.
  const auto grid = trainrun::load_experiment(box.run_dir("search"));
  REQUIRE(grid.best() != nullptr);
  CHECK(grid.best()->config["q"] == 2);
  CHECK(grid.best("score", "min")->config["q"] == 1);
  CHECK(std::filesystem::exists(grid.best_checkpoint() / "state.txt"));
  CHECK(grid.num_errors() == 0);
  const auto page = read_text(box.run_dir("search") / "report.html");
  CHECK(page.find("trial_0003") != std::string::npos);
}

TEST_CASE("tune: ASHA stops the trials its rule says, at the rung, with their checkpoints kept") {
  // One at a time, in order, q = 3, 1, 4, 2; rungs at 1, 2 (4 is max_t).
  // trial 0: recorded at 1 (3) and 2 (6), stops at max_t 4 as finished.
  // trial 1: at 1, 1 is below the cutoff of {3} (3): stopped after 1 report.
  // trial 2: at 1, 4 >= median {1, 3} = 2; at 2, 8 >= 6: finished at 4.
  // trial 3: at 1, 2 is below the median of {1, 3, 4} = 3: stopped after 1.
  Sandbox box;
  auto out = box.run(tune_args("asha",
                               "--param q=grid:3,1,4,2 --scheduler asha --max-t 4 "
                               "--grace-period 1 --reduction-factor 2 --max-concurrent-trials 1 "
                               "--config epochs=6"));
  INFO(out.output);
  REQUIRE(out.exit_code == 0);
  const auto record = experiment(box, "asha");
  const std::vector<std::string> status{"finished", "stopped", "finished", "stopped"};
  const std::vector<size_t> count{4, 1, 4, 1};
  for (size_t i = 0; i < 4; ++i) {
    const auto& t = record["trials"][i];
    INFO(t.dump());
    CHECK(t["status"] == status[i]);
    const auto dir = box.run_dir("asha") / t["name"].get<std::string>();
    // The verdict comes before the trial goes on: nothing past its rung.
    CHECK(reports(dir).size() == count[i]);
    CHECK(std::filesystem::exists(dir / "checkpoint_000000" / "state.txt"));
  }
  CHECK(record["trials"][1]["note"].get<std::string>().find("below the rung's cutoff 3") !=
        std::string::npos);
  CHECK(out.output.find("tune: best score 16.0: trial_0002") != std::string::npos);
}

TEST_CASE("tune: PBT's lagging trial goes on from the leader's checkpoint with perturbed values") {
  if (usable_cpus() < 2) {
    MESSAGE("skipped: PBT's population needs 2 trials at once, on 2 CPUs");
    return;
  }
  Sandbox box;
  const auto events = box.root() / "events";
  std::filesystem::create_directories(events);
  auto out = box.run(tune_args("pbt",
                               "--param q=uniform:0.1:2 --num-samples 2 --seed 3 --scheduler pbt "
                               "--perturbation-interval 1 --resample-probability 0 "
                               "--cpus-per-worker 1 --max-concurrent-trials 2 --config epochs=6 "
                               "--config sleep_ms=300 --config barrier=2 --config events=" +
                                   events.string()));
  INFO(out.output);
  REQUIRE(out.exit_code == 0);
  const auto record = experiment(box, "pbt");
  const std::regex copied(R"(start (\d+) (trial_\d+) q=([0-9.]+))");
  int copies = 0;
  for (const auto& t : record["trials"]) {
    const auto name = t["name"].get<std::string>();
    CHECK(t["status"] == "finished");
    const auto lines = event_lines(events, name);
    REQUIRE(!lines.empty());
    CHECK(lines.front().rfind("start 0 scratch", 0) == 0);
    for (const auto& line : lines) {
      std::smatch m;
      if (!std::regex_match(line, m, copied) || m[2] == name) continue;
      ++copies;
      INFO(line);
      // It took the other's checkpoint at some epoch, and the other's q then
      // (its report of that epoch says), times 1.2 or 0.8.
      const int epoch = std::stoi(m[1]);
      CHECK(epoch >= 1);
      const double q = std::stod(m[3]);
      bool perturbed = false;
      for (const auto& r : reports(box.run_dir("pbt") / m[2].str())) {
        if (r["metrics"]["epoch"] != epoch) continue;
        const double source = r["metrics"]["q"].get<double>();
        perturbed =
            perturbed || std::fabs(q - source * 1.2) < 1e-4 || std::fabs(q - source * 0.8) < 1e-4;
      }
      CHECK(perturbed);
    }
    if (t["starts"].get<int>() > 1) {
      CHECK(t["note"].get<std::string>().find("takes the latest checkpoint of trial_") !=
            std::string::npos);
    }
  }
  CHECK(copies >= 1);
}

TEST_CASE("tune: trials are packed on the CPUs, never more at once, and refused beyond them") {
  Sandbox box;
  const int cpus = usable_cpus();
  auto out = box.run(tune_args("pack",
                               "--param q=grid:1,2,3,4,5 --cpus-per-worker 1 --config epochs=3 "
                               "--config sleep_ms=200"));
  INFO(out.output);
  REQUIRE(out.exit_code == 0);
  auto record = experiment(box, "pack");
  for (const auto& t : record["trials"]) CHECK(t["status"] == "finished");
  CHECK(most_at_once(box, record) <= std::min(cpus, 5));

  out =
      box.run(tune_args("one", "--param q=grid:1,2,3 --max-concurrent-trials 1 --config epochs=2"));
  REQUIRE(out.exit_code == 0);
  CHECK(most_at_once(box, experiment(box, "one")) == 1);

  out = box.run(tune_args("big", "--param q=grid:1 --cpus-per-worker 100000"));
  CHECK(out.exit_code == 2);
  CHECK(out.output.find("a trial takes 100000 CPUs (1 workers x 100000), more than the") !=
        std::string::npos);
}

TEST_CASE("tune: a trial whose worker is killed fails alone, or recovers with --max-failures") {
  Sandbox box;
  const auto events = box.root() / "events";
  std::filesystem::create_directories(events);
  const std::string space =
      "--param q=grid:1 --param kill_at=grid:1,-1 --max-concurrent-trials 1 "
      "--config epochs=3 --config events=" +
      events.string();
  auto out = box.run(tune_args("fails", space));
  INFO(out.output);
  CHECK(out.exit_code == 0);  // not every trial failed
  auto record = experiment(box, "fails");
  CHECK(record["trials"][0]["status"] == "failed");
  CHECK(record["trials"][0]["note"].get<std::string>().find("SIGKILL") != std::string::npos);
  CHECK(record["trials"][1]["status"] == "finished");
  CHECK(record["trials"][1]["iterations"] == 3);

  std::filesystem::remove_all(events);
  std::filesystem::create_directories(events);
  out = box.run(tune_args("recovers", space + " --max-failures 1"));
  INFO(out.output);
  REQUIRE(out.exit_code == 0);
  record = experiment(box, "recovers");
  for (const auto& t : record["trials"]) CHECK(t["status"] == "finished");
  CHECK(record["trials"][0]["starts"] == 1);  // recovered inside its own run
  const auto lines = event_lines(events, "trial_0000");
  CHECK(std::find(lines.begin(), lines.end(), "start 1 trial_0000 q=1.000000") != lines.end());
}

TEST_CASE("tune: a killed tuner run again keeps finished trials and resumes the others") {
  Sandbox box;
  const auto events = box.root() / "events";
  std::filesystem::create_directories(events);
  const std::string command =
      tune_args("resume",
                "--param q=grid:1,2,3,4 --scheduler asha --max-t 100 --grace-period 1 "
                "--reduction-factor 1.5 --max-concurrent-trials 2 --cpus-per-worker 1 "
                "--config epochs=5 --config sleep_ms=300 --config events=" +
                    events.string());
  const pid_t tuner = box.start(command);
  // Frozen, the tuner starts nothing and answers no report: its record then
  // names every trial that may run. Killed once a trial has finished and
  // every running one has a checkpoint.
  json at_kill;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(180);
  while (at_kill.is_null() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    ::kill(tuner, SIGSTOP);
    wait_stopped(tuner);
    auto record = json::parse(read_text(box.run_dir("resume") / "experiment.json"), nullptr, false);
    bool ready = record.is_object();
    int finished = 0;
    int running = 0;
    for (const auto& t : ready ? record["trials"] : json::array()) {
      finished += t["status"] == "finished" || t["status"] == "stopped";
      if (t["status"] == "running") {
        ++running;
        ready = ready && t["iterations"].get<int>() >= 1;
      }
    }
    if (ready && finished >= 1 && running >= 1) {
      at_kill = record;
      ::kill(tuner, SIGKILL);
    }
    ::kill(tuner, SIGCONT);
  }
  INFO(box.output_so_far());
  REQUIRE(!at_kill.is_null());
  Sandbox::wait(tuner);
  // The trials die with it, and their runs are free at once.
  for (int i = 0; i < 300 && (box.any_worker_alive() || any_trial_held(box, at_kill)); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  REQUIRE(!box.any_worker_alive());
  REQUIRE(!any_trial_held(box, at_kill));

  auto out = box.run(command);
  INFO(out.output);
  REQUIRE(out.exit_code == 0);
  CHECK(out.output.find("tune: resuming") != std::string::npos);
  const auto record = experiment(box, "resume");
  // The scheduler's state came back with it: the rungs hold the trials from before.
  CHECK(record["scheduler_state"]["rungs"].back()["recorded"].size() == 4);
  for (size_t i = 0; i < 4; ++i) {
    const auto& before = at_kill["trials"][i];
    const auto& after = record["trials"][i];
    const auto name = after["name"].get<std::string>();
    INFO(name);
    CHECK((after["status"] == "finished" || after["status"] == "stopped"));
    if (before["status"] == "finished" || before["status"] == "stopped") {
      CHECK(after == before);  // kept as it was
    }
    // Never run twice from the start: one start from scratch, and a resumed
    // trial went on from its own checkpoint.
    const auto lines = event_lines(events, name);
    CHECK(std::count_if(lines.begin(), lines.end(), [](const std::string& l) {
            return l.rfind("start 0 scratch", 0) == 0;
          }) == 1);
    if (before["status"] == "running") {
      CHECK(after["starts"] == 2);
      CHECK(std::any_of(lines.begin() + 1, lines.end(), [&](const std::string& l) {
        return l.rfind("start ", 0) == 0 && l.find(" " + name + " ") != std::string::npos;
      }));
    }
  }
}

TEST_CASE("tune: a malformed search space or setting is refused in one line") {
  Sandbox box;
  const std::vector<std::pair<std::string, std::string>> cases{
      {"--param lr=loguniform:0:1", "search space: loguniform needs 0 < LOW < HIGH"},
      {"--param lr=uniform:1", "search space: uniform takes uniform:LOW:HIGH; got 'uniform:1'"},
      {"--param lr=normal:0:1", "is not grid:A,B,..., choice:A,B,..."},
      {"--param lr", "--param takes KEY=DOMAIN; got 'lr'"},
      {"--param q=grid:1,,2", "search space: an empty value in 'grid:1,,2'"},
      {"--param q=randint:1.5:3", "randint needs integer bounds"},
      {"--param q=uniform:0:nan", "is not a finite number"},
      {"--param q=grid:1 --scheduler asha --reduction-factor 1", "ASHA needs a reduction_factor"},
      {"--param q=grid:1 --scheduler pbt", "PBT needs a search space key to perturb"},
      {"--param q=uniform:0:1 --scheduler pbt --max-concurrent-trials 1",
       "PBT needs at least 2 trials at once; this host holds 1"},
      {"--param q=grid:1e999", "search space: '1e999' is not a finite number"},
      {"--param q=grid:1 --scheduler asha --reduction-factor 1.0001 --max-t 1e9",
       "ASHA would make more than 64 rungs"},
      {"--param q=grid:1 --param q=grid:2", "--param q is given twice"},
  };
  for (const auto& [args, message] : cases) {
    auto out = box.run(tune_args("bad", args));
    INFO(args);
    INFO(out.output);
    CHECK(out.exit_code == 2);
    CHECK(out.output.find(message) != std::string::npos);
    CHECK(std::count(out.output.begin(), out.output.end(), '\n') == 1);
  }
  // A rerun of an experiment with another space is refused, its record untouched.
  REQUIRE(box.run(tune_args("kept", "--param q=grid:1 --config epochs=1")).exit_code == 0);
  const auto before = read_text(box.run_dir("kept") / "experiment.json");
  auto out = box.run(tune_args("kept", "--param q=grid:2 --config epochs=1"));
  CHECK(out.exit_code == 2);
  CHECK(out.output.find("was made with another search space") != std::string::npos);
  CHECK(read_text(box.run_dir("kept") / "experiment.json") == before);
}

TEST_CASE("tune: Ctrl-C interrupts the running trials, and the same command resumes them") {
  Sandbox box;
  const auto events = box.root() / "events";
  std::filesystem::create_directories(events);
  const std::string command =
      tune_args("interrupted",
                "--param q=grid:1,2,3 --max-concurrent-trials 1 --config epochs=4 "
                "--config sleep_ms=300 --config events=" +
                    events.string());
  const pid_t tuner = box.start(command);
  bool reported = false;
  for (int i = 0; i < 1800 && !reported; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    auto record =
        json::parse(read_text(box.run_dir("interrupted") / "experiment.json"), nullptr, false);
    reported = record.is_object() && record["trials"][0]["iterations"].get<int>() >= 1;
  }
  INFO(box.output_so_far());
  REQUIRE(reported);
  ::kill(tuner, SIGINT);
  CHECK(Sandbox::wait(tuner) == 130);
  auto record = experiment(box, "interrupted");
  CHECK(record["status"] == "interrupted");
  CHECK(record["trials"][0]["status"] == "pending");
  CHECK(record["trials"][2]["status"] == "pending");
  auto out = box.run(command);
  INFO(out.output);
  REQUIRE(out.exit_code == 0);
  record = experiment(box, "interrupted");
  CHECK(record["status"] == "finished");
  for (const auto& t : record["trials"]) {
    CHECK(t["status"] == "finished");
    const auto lines = event_lines(events, t["name"].get<std::string>());
    CHECK(std::count_if(lines.begin(), lines.end(), [](const std::string& l) {
            return l.rfind("start 0 scratch", 0) == 0;
          }) == 1);
  }
}

TEST_CASE("tune: a verdict recorded before the tuner died is carried out when it resumes") {
  // The window between a verdict's record and the trial's exit, made by hand:
  // two finished trials put back to running, one with a stop, one with a copy.
  Sandbox box;
  const auto events = box.root() / "events";
  std::filesystem::create_directories(events);
  const std::string command = tune_args(
      "verdicts", "--param q=grid:1,2 --config epochs=2 --config events=" + events.string());
  REQUIRE(box.run(command).exit_code == 0);
  const auto file = box.run_dir("verdicts") / "experiment.json";
  auto record = read_json(file);
  const auto source = (box.run_dir("verdicts") / "trial_0001" / "checkpoint_000000").string();
  record["trials"][0]["status"] = "running";
  record["trials"][0]["verdict"] = {{"action", "exploit"},
                                    {"reason", "PBT by hand"},
                                    {"config", {{"q", 5}}},
                                    {"checkpoint", source}};
  record["trials"][1]["status"] = "running";
  record["trials"][1]["verdict"] = {{"action", "stop"}, {"reason", "ASHA by hand"}};
  std::ofstream(file) << record.dump(2);

  auto out = box.run(command);
  INFO(out.output);
  REQUIRE(out.exit_code == 0);
  record = read_json(file);
  const auto& copied = record["trials"][0];
  CHECK(copied["status"] == "finished");
  CHECK(copied["config"]["q"] == 5);
  CHECK(copied["starts"] == 2);
  CHECK(copied["note"] == "PBT by hand");
  CHECK(copied["verdict"].is_null());
  // It went on from the other trial's checkpoint of epoch 1, with its new value.
  const auto lines = event_lines(events, "trial_0000");
  CHECK(std::find(lines.begin(), lines.end(), "start 1 trial_0001 q=5.000000") != lines.end());
  const auto& stopped = record["trials"][1];
  CHECK(stopped["status"] == "stopped");
  CHECK(stopped["note"] == "ASHA by hand");
  CHECK(stopped["starts"] == 1);  // not started again
}
