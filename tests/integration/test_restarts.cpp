// Restarts (--max-failures): a failed attempt is stopped, and the group starts
// again from the latest committed checkpoint, with real worker processes,
// real kills and real Gloo collectives.

#include <doctest/doctest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <random>
#include <regex>
#include <set>
#include <thread>

#include "common/hash.h"
#include "run_helpers.h"

namespace {

const std::string kResumable =
    std::string("--plugin '") + TEST_PLUGIN + "' --entry resumable -n 2 --name r";

// The record's rule across attempts: iterations count 1, 2, 3... with no gap
// and no repeat; attempts and time_total_s never go back; each attempt after
// the first resumes at the step of the latest checkpoint committed before it
// (the steps reported after that checkpoint are done, and recorded, again).
// Returns the attempts seen.
int check_record(const std::vector<nlohmann::json>& results) {
  int attempt = 1;
  int checkpointed = 0;  // steps in the latest checkpoint recorded so far
  double time_total = 0;
  for (size_t i = 0; i < results.size(); ++i) {
    const auto& line = results[i];
    INFO(line.dump());
    CHECK(line["iteration"] == static_cast<int64_t>(i + 1));
    CHECK(line["time_total_s"].get<double>() >= time_total);
    time_total = line["time_total_s"].get<double>();
    int this_attempt = line["attempt"].get<int>();
    CHECK(this_attempt >= attempt);
    if (this_attempt != attempt) {
      CHECK(line["metrics"]["resumed_at"] == checkpointed);
      CHECK(line["metrics"]["step"] == checkpointed);
      attempt = this_attempt;
    }
    CHECK(line["metrics"]["sum"] == 2.0);  // both ranks joined the allreduce
    if (line.contains("checkpoint")) checkpointed = line["metrics"]["step"].get<int>() + 1;
  }
  return attempt;
}

}  // namespace

TEST_CASE("a rank killed mid-run restarts the group from the latest checkpoint") {
  Sandbox box;
  auto marker = (box.root() / "failed-once").string();
  auto run = box.run(kResumable + " --max-failures 2 --config steps=6 --config fail_step=3" +
                     " --config checkpoint_every=2 --config marker=" + marker);
  INFO(run.output);
  REQUIRE(run.exit_code == 0);
  CHECK(run.output.find("attempt 2/3 after rank 1") != std::string::npos);
  CHECK(run.output.find("was killed by SIGKILL") != std::string::npos);
  auto dir = box.run_dir("r");
  auto results = read_jsonl(dir / "result.jsonl");
  // Steps 0-2 in attempt 1 (checkpoints after 1), then 2-5 again from step 2.
  REQUIRE(results.size() == 7);
  CHECK(check_record(results) == 2);
  CHECK(results[3]["attempt"] == 2);
  CHECK(results[3]["metrics"]["resumed_at"] == 2);
  CHECK(results[6]["metrics"]["step"] == 5);
  auto info = read_json(dir / "run.json");
  CHECK(info["status"] == "finished");
  CHECK(info["max_failures"] == 2);
  REQUIRE(info["attempts"].size() == 2);
  CHECK(info["attempts"][0]["error"]["kind"] == "signal");
  CHECK(info["attempts"][0]["error"]["rank"] == 1);
  CHECK(info["attempts"][1]["resumed_from"] == "checkpoint_000000");
  CHECK_FALSE(info["attempts"][1].contains("error"));
  CHECK_FALSE(std::filesystem::exists(dir / "error.json"));  // the run finished
  auto progress = read_text(dir / "progress.csv");
  CHECK(std::count(progress.begin(), progress.end(), '\n') == 8);  // header and 7 rows
  CHECK_FALSE(box.any_worker_alive());
}

TEST_CASE("a rank killed while asynchronous checkpoints upload restarts from the last committed") {
  Sandbox box;
  auto marker = (box.root() / "failed-once").string();
  auto run = box.run(kResumable + " --max-failures 1 --config steps=6 --config fail_step=3" +
                     " --config upload_mode=async --config marker=" + marker);
  INFO(run.output);
  REQUIRE(run.exit_code == 0);
  auto dir = box.run_dir("r");
  auto reports = read_reports(dir / "result.jsonl");
  CHECK(check_record(reports) == 2);
  REQUIRE(!reports.empty());
  CHECK(reports.back()["metrics"]["step"] == 5);
  CHECK(reports.back()["checkpoint"].is_string());  // the run waited for the last commit
  // The second attempt resumed from the last checkpoint committed in the
  // first (whichever the kill let commit).
  std::string committed;
  for (const auto& report : reports) {
    if (report["attempt"] == 1 && report.contains("checkpoint")) committed = report["checkpoint"];
  }
  auto info = read_json(dir / "run.json");
  REQUIRE(info["attempts"].size() == 2);
  CHECK(info["attempts"][1].value("resumed_from", "") == committed);
  auto state = read_json(dir / "checkpoint_state.json");
  CHECK(state["latest"] == reports.back()["checkpoint"]);
}

TEST_CASE("when the failures are used up, error.json names the last root cause and attempt") {
  Sandbox box;
  auto run = box.run(std::string("--plugin '") + TEST_PLUGIN +
                     "' --entry crash -n 2 --name c --max-failures 1");
  INFO(run.output);
  CHECK(run.exit_code == 1);
  CHECK(run.output.find("attempt 2/2 after") != std::string::npos);
  CHECK(run.output.find("run failed after 2 attempts") != std::string::npos);
  auto dir = box.run_dir("c");
  auto error = read_json(dir / "error.json");
  CHECK(error["attempt"] == 2);
  CHECK(error["rank"] == 1);
  CHECK(error["kind"] == "signal");
  auto info = read_json(dir / "run.json");
  CHECK(info["status"] == "failed");
  REQUIRE(info["attempts"].size() == 2);
  CHECK(info["attempts"][0]["error"]["pid"] != info["attempts"][1]["error"]["pid"]);
  // One report per attempt, counted on.
  auto results = read_jsonl(dir / "result.jsonl");
  REQUIRE(results.size() == 2);
  CHECK(results[1]["iteration"] == 2);
  CHECK(results[1]["attempt"] == 2);
  auto shown = box.run("results '" + dir.string() + "'");
  CHECK(shown.output.find("attempts:") != std::string::npos);
  CHECK(shown.output.find("(attempt 2)") != std::string::npos);
  CHECK_FALSE(box.any_worker_alive());
}

TEST_CASE("attempts that keep failing before any report wait longer and longer between them") {
  Sandbox box;
  auto run = box.run(std::string("--plugin '") + TEST_PLUGIN +
                     "' --entry crash -n 2 --name early --max-failures 3 --config at_start=true");
  INFO(run.output);
  CHECK(run.exit_code == 1);
  CHECK(run.output.find("attempt 2/4 after") != std::string::npos);
  CHECK(run.output.find("before attempt 2") == std::string::npos);  // the first is at once
  CHECK(run.output.find("waiting 0.5 s before attempt 3: the last 2 attempts failed") !=
        std::string::npos);
  CHECK(run.output.find("waiting 1.0 s before attempt 4: the last 3 attempts failed") !=
        std::string::npos);
  CHECK(read_json(box.run_dir("early") / "error.json")["attempt"] == 4);
  CHECK(read_text(box.run_dir("early") / "result.jsonl").empty());  // none reported
}

TEST_CASE("a usage error is not retried") {
  Sandbox box;
  auto run = box.run(std::string("--plugin '") + TEST_PLUGIN +
                     "' --entry mismatch -n 2 --name m --max-failures 3");
  INFO(run.output);
  CHECK(run.exit_code == 1);
  CHECK(run.output.find("attempt 2") == std::string::npos);
  auto info = read_json(box.run_dir("m") / "run.json");
  CHECK(info["attempts"].size() == 1);
  CHECK(read_json(box.run_dir("m") / "error.json")["kind"] == "usage");
}

TEST_CASE("a rank that throws once is retried, and the run finishes") {
  Sandbox box;
  auto marker = (box.root() / "failed-once").string();
  auto run = box.run(kResumable + " --max-failures 1 --config steps=4 --config how=throw" +
                     " --config marker=" + marker);
  INFO(run.output);
  REQUIRE(run.exit_code == 0);
  CHECK(run.output.find(": failing once at step 2") != std::string::npos);
  auto results = read_jsonl(box.run_dir("r") / "result.jsonl");
  CHECK(check_record(results) == 2);
  CHECK(results.back()["metrics"]["step"] == 3);
}

TEST_CASE("a stopped rank (SIGSTOP) is lost at the heartbeat timeout, and the group restarts") {
  Sandbox box;
  auto marker = (box.root() / "failed-once").string();
  auto run = box.run(kResumable + " --max-failures 1 --heartbeat-timeout 2 --config steps=4" +
                     " --config how=stop --config marker=" + marker);
  INFO(run.output);
  REQUIRE(run.exit_code == 0);
  auto info = read_json(box.run_dir("r") / "run.json");
  REQUIRE(info["attempts"].size() == 2);
  CHECK(info["attempts"][0]["error"]["kind"] == "lost");
  CHECK(info["attempts"][0]["error"]["rank"] == 1);
  CHECK(check_record(read_jsonl(box.run_dir("r") / "result.jsonl")) == 2);
  CHECK_FALSE(box.any_worker_alive());  // the stopped process too
}

TEST_CASE("a rank that stops joining collectives fails at the collective timeout and restarts") {
  Sandbox box;
  auto marker = (box.root() / "failed-once").string();
  auto run = box.run(kResumable + " --max-failures 1 --collective-timeout 2 --config steps=4" +
                     " --config how=hang --config marker=" + marker);
  INFO(run.output);
  REQUIRE(run.exit_code == 0);
  auto info = read_json(box.run_dir("r") / "run.json");
  REQUIRE(info["attempts"].size() == 2);
  CHECK(info["attempts"][0]["error"]["message"].get<std::string>().find("Timed out") !=
        std::string::npos);
  CHECK(check_record(read_jsonl(box.run_dir("r") / "result.jsonl")) == 2);
}

// kill -9 of a random worker at a random moment (starting, training,
// checkpointing, stopping), 20 times in one run with no failure limit. Every
// other kill first waits for the new attempt to report, so that the run goes
// on between kills; the others can land at any point of a restart.
TEST_CASE("soak: 20 random kill -9s, and the run still finishes with every checkpoint whole") {
  Sandbox box;
  constexpr int kKills = 20;
  constexpr int kSteps = 800;
  pid_t controller = box.start(kResumable + " --max-failures -1 --num-to-keep 3 --config steps=" +
                               std::to_string(kSteps) + " --config sleep_ms=20");
  std::mt19937 random(std::random_device{}());
  std::uniform_int_distribution<int> pause_ms(50, 700);
  std::set<pid_t> killed;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  int exited = -1;
  auto reports = [&] {
    auto out = box.output_so_far();
    size_t count = 0;
    for (auto at = out.find("] report "); at != std::string::npos;
         at = out.find("] report ", at + 1)) {
      ++count;
    }
    return count;
  };
  size_t reported = 0;
  while (static_cast<int>(killed.size()) < kKills && std::chrono::steady_clock::now() < deadline) {
    if (killed.size() % 2 == 1) {
      for (int i = 0; i < 400 && reports() <= reported; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(25));
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(pause_ms(random)));
    reported = reports();
    int status = 0;
    if (::waitpid(controller, &status, WNOHANG) == controller) {
      exited = WIFEXITED(status) ? WEXITSTATUS(status) : 128;
      break;
    }
    auto workers = box.worker_pids();
    workers.erase(std::remove_if(workers.begin(), workers.end(),
                                 [&](pid_t pid) { return killed.count(pid) > 0; }),
                  workers.end());
    if (workers.empty()) continue;
    pid_t victim = workers[std::uniform_int_distribution<size_t>(0, workers.size() - 1)(random)];
    if (::kill(victim, SIGKILL) == 0) killed.insert(victim);
  }
  if (exited < 0) exited = Sandbox::wait(controller);
  auto output = box.output_so_far();
  INFO(output.substr(output.size() > 6000 ? output.size() - 6000 : 0));
  // As many kills as the machine's speed let land before the deadline: a
  // slow machine restarts more slowly (and backs off), so no exact count.
  MESSAGE(killed.size() << " of " << kKills << " kills landed");
  CHECK(killed.size() >= 5);
  REQUIRE(exited == 0);
  auto dir = box.run_dir("r");
  auto results = read_jsonl(dir / "result.jsonl");
  int attempts = check_record(results);
  CHECK(attempts >= 2);
  CHECK(attempts <= kKills + 1);
  CHECK(results.back()["metrics"]["step"] == kSteps - 1);
  auto info = read_json(dir / "run.json");
  CHECK(info["status"] == "finished");
  CHECK(info["attempts"].size() == static_cast<size_t>(attempts));
  // Every kept checkpoint is whole, and the latest holds the last step.
  auto shown = box.run("results '" + dir.string() + "'");
  CHECK(shown.exit_code == 0);
  auto state = read_json(dir / "checkpoint_state.json");
  REQUIRE(state["checkpoints"].size() == 3);
  for (const auto& c : state["checkpoints"]) {
    auto checkpoint = dir / c["name"].get<std::string>();
    auto manifest = read_json(checkpoint / "manifest.json");
    for (const auto& file : manifest["files"]) {
      CHECK(trainrun::sha256_file(checkpoint / file["path"].get<std::string>()) == file["sha256"]);
    }
  }
  CHECK(read_text(dir / state["latest"].get<std::string>() / "step.txt") == std::to_string(kSteps));
  CHECK_FALSE(box.any_worker_alive());
}

// The FashionMNIST recipe with rank 0 killed halfway through its second epoch
// resumes from the first epoch's checkpoint and ends where an uninterrupted
// run ends, bit for bit: the data order follows the epoch, the model and Adam
// come back whole, and with one thread per worker nothing else varies, so the
// redone epoch is the same epoch.
TEST_CASE("FashionMNIST killed mid-epoch ends with the uninterrupted run's losses and weights") {
  Sandbox box;
  const std::string recipe = std::string("--plugin '") + FASHION_MNIST_PLUGIN +
                             "' -n 2 --cpus-per-worker 1 --config epochs=2 --config max_steps=24"
                             " --config eval_steps=20 --config batch_size=32"
                             " --config log_every=1";
  auto whole = box.run(recipe + " --name whole");
  INFO(whole.output);
  REQUIRE(whole.exit_code == 0);
  pid_t controller = box.start(recipe + " --name killed --max-failures 1");
  // Early in epoch 1, so that a slow look still finds the run in it.
  std::regex step_line("\\[rank 0 \\([^,]+, pid ([0-9]+)\\)\\] epoch 1 step 2/");
  pid_t victim = 0;
  for (int i = 0; i < 2400 && victim == 0; ++i) {
    auto out = box.output_so_far();
    std::smatch match;
    if (std::regex_search(out, match, step_line)) {
      victim = std::stoi(match[1]);
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(25));
    }
  }
  REQUIRE(victim > 0);
  ::kill(victim, SIGKILL);
  CHECK(Sandbox::wait(controller) == 0);
  auto out = box.output_so_far();
  INFO(out);
  CHECK(out.find("resuming after epoch 0") != std::string::npos);
  auto expected = read_jsonl(box.run_dir("whole") / "result.jsonl");
  auto resumed = read_jsonl(box.run_dir("killed") / "result.jsonl");
  REQUIRE(expected.size() == 2);
  REQUIRE(resumed.size() == 2);  // epoch 1's report came only from the second attempt
  CHECK(resumed[1]["attempt"] == 2);
  CHECK(resumed[1]["metrics"]["epoch"] == 1);
  CHECK(expected[1]["metrics"]["accuracy"].get<double>() > 0.5);  // it learned something
  for (const std::string metric : {"loss", "accuracy", "test_loss"}) {
    CAPTURE(metric);
    for (size_t epoch = 0; epoch < 2; ++epoch) {
      CAPTURE(epoch);
      CHECK(resumed[epoch]["metrics"][metric].get<double>() ==
            expected[epoch]["metrics"][metric].get<double>());
    }
  }
  // The last checkpoint's weights and buffers: the same bytes (optimizer.pt
  // names each state by its tensor's address, which differs by process; the
  // losses of epoch 1 above came from that state).
  auto files = [&](const std::string& name) {
    const auto dir = box.run_dir(name);
    const auto latest = read_json(dir / "checkpoint_state.json")["latest"].get<std::string>();
    std::map<std::string, std::string> sha256;
    const auto manifest = read_json(dir / latest / "manifest.json");
    for (const auto& file : manifest["files"]) {
      const auto path = file["path"].get<std::string>();
      if (path != "optimizer.pt") sha256[path] = file["sha256"].get<std::string>();
    }
    return sha256;
  };
  const auto whole_files = files("whole");
  CHECK(whole_files.count("model.pt") == 1);
  CHECK(files("killed") == whole_files);
}

TEST_CASE("Ctrl-C between attempts ends the run as interrupted, standby workers and all") {
  Sandbox box;
  pid_t controller = box.start(std::string("--plugin '") + TEST_PLUGIN +
                               "' --entry crash -n 2 --name stop --max-failures -1"
                               " --config at_start=true");
  // Attempts fail at once and keep failing: the run backs off between them.
  bool waiting = false;
  for (int i = 0; i < 2400 && !waiting; ++i) {
    waiting = box.output_so_far().find("waiting 1.0 s before attempt") != std::string::npos;
    if (!waiting) std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  REQUIRE(waiting);
  auto asked = std::chrono::steady_clock::now();
  ::kill(controller, SIGINT);
  CHECK(Sandbox::wait(controller) == 130);
  // Not the back-off's wait, nor a next attempt: the stop's grace periods at most.
  CHECK(std::chrono::steady_clock::now() - asked < std::chrono::seconds(15));
  auto error = read_json(box.run_dir("stop") / "error.json");
  CHECK(error["kind"] == "interrupted");
  CHECK(read_json(box.run_dir("stop") / "run.json")["status"] == "interrupted");
  CHECK_FALSE(box.any_worker_alive());
}

TEST_CASE("--num-workers takes N or MIN:MAX, and --max-failures -1 or more") {
  Sandbox box;
  const std::string plugin = std::string("--plugin '") + TEST_PLUGIN + "' --entry context ";
  for (const char* bad : {"-n 3:2", "-n 0", "-n x:2", "-n :2", "-n 2:", "-n 2 --max-failures -2"}) {
    auto run = box.run(plugin + bad);
    INFO(bad << ": " << run.output);
    CHECK(run.exit_code == 2);
    CHECK(std::count(run.output.begin(), run.output.end(), '\n') <= 2);  // one line, and --help
  }
  // An elastic run of local workers starts with all of them.
  auto run = box.run(plugin + "-n 1:2 --name local");
  INFO(run.output);
  REQUIRE(run.exit_code == 0);
  CHECK(read_json(box.run_dir("local") / "run.json")["attempts"][0]["world_size"] == 2);
}

TEST_CASE("an elastic run starts at the startup timeout with the workers that came") {
  Sandbox box;
  auto run = box.run(std::string("--plugin '") + TEST_PLUGIN +
                     "' --entry context -n 2:3 --listen tcp://127.0.0.1:0 --local-workers 2"
                     " --startup-timeout 10 --name few");
  INFO(run.output);
  REQUIRE(run.exit_code == 0);
  CHECK(run.output.find("starting with 2 of 3 workers") != std::string::npos);
  auto info = read_json(box.run_dir("few") / "run.json");
  CHECK(info["attempts"][0]["world_size"] == 2);
  CHECK(read_jsonl(box.run_dir("few") / "result.jsonl").back()["metrics"]["world_size"] == 2);
}
