#include <doctest/doctest.h>
#include <signal.h>

#include <fstream>
#include <regex>
#include <thread>

#include "run_helpers.h"

namespace {

const std::string kTestPlugin = std::string("--plugin '") + TEST_PLUGIN + "'";

}  // namespace

TEST_CASE("two workers: each rank sees its context and rank 0 metrics are recorded") {
  Sandbox box;
  auto run = box.run(kTestPlugin +
                     " --entry context -n 2 --cpus-per-worker 1 --name ctx"
                     " --config reports=3 --config label=hello");
  INFO(run.output);
  REQUIRE(run.exit_code == 0);
  auto dir = box.run_dir("ctx");
  for (int rank = 0; rank < 2; ++rank) {
    auto expected = "context world_rank=" + std::to_string(rank) +
                    " local_rank=" + std::to_string(rank) +
                    " node_rank=0 world_size=2 local_world_size=2 device=cpu run_name=ctx"
                    " env_rank=" +
                    std::to_string(rank) + " env_world_size=2 threads=1";
    CHECK(read_text(dir / "logs" / ("worker-" + std::to_string(rank) + ".log")).find(expected) !=
          std::string::npos);
    CHECK(run.output.find("[rank " + std::to_string(rank) + " (") != std::string::npos);
  }
  auto results = read_jsonl(dir / "result.jsonl");
  REQUIRE(results.size() == 3);
  for (int i = 0; i < 3; ++i) {
    const auto& metrics = results[static_cast<size_t>(i)]["metrics"];
    CHECK(results[static_cast<size_t>(i)]["iteration"] == i + 1);
    CHECK(metrics["i"] == i);
    CHECK(metrics["world_rank"] == 0);  // rank 0's metrics
    CHECK(metrics["world_size"] == 2);
    CHECK(metrics["rank_sum"] == 1.0);  // 0 + 1: the allreduce ran across both
    CHECK(metrics["label"] == "hello");
    CHECK(metrics["even"] == (i % 2 == 0));
  }
  auto csv = read_text(dir / "progress.csv");
  CHECK(csv.rfind("iteration,timestamp,time_total_s,attempt,", 0) == 0);
  CHECK(std::count(csv.begin(), csv.end(), '\n') == 4);
  auto info = read_json(dir / "run.json");
  CHECK(info["status"] == "finished");
  CHECK(info["scaling"]["num_workers"] == 2);
  CHECK(info["config"]["label"] == "hello");
  CHECK_FALSE(std::filesystem::exists(dir / "error.json"));
  CHECK(run.output.find("report 3") != std::string::npos);
  CHECK(run.output.find("run finished: 3 reports") != std::string::npos);
  CHECK_FALSE(box.any_worker_alive());
}

TEST_CASE("a train function that throws on rank 1 fails the run with that rank's message") {
  Sandbox box;
  auto run = box.run(kTestPlugin + " --entry throws -n 2 --name t --config fail_rank=1");
  INFO(run.output);
  CHECK(run.exit_code == 1);
  auto error = read_json(box.run_dir("t") / "error.json");
  CHECK(error["kind"] == "exception");
  CHECK(error["rank"] == 1);
  // Where it was thrown, from the worker's record of the throw.
  // (The compiler may move the throw to a cold part of the function, whose
  // lines are its own.)
  const auto message = error["message"].get<std::string>();
  CHECK(message.rfind("raised in throws(train::Config const&)", 0) == 0);
  CHECK(message.find(" at test_plugin.cpp:") != std::string::npos);
  CHECK(message.substr(message.size() - 16) == ": boom on rank 1");
  const auto thrown = error["stack"][0].get<std::string>();
  CHECK(thrown.rfind("throws(train::Config const&)", 0) == 0);
  CHECK(thrown.find("tests/plugins/test_plugin.cpp:") != std::string::npos);
  CHECK(thrown.find(" in libtest_plugin.so") != std::string::npos);
  CHECK(error["pid"].get<int64_t>() > 0);
  CHECK(run.output.find("run failed: rank 1 (") != std::string::npos);
  CHECK(read_json(box.run_dir("t") / "run.json")["status"] == "failed");
  CHECK(run.seconds < 30);  // rank 0, stuck in a collective, was stopped
  CHECK_FALSE(box.any_worker_alive());
}

TEST_CASE("a worker killed by a signal fails the run naming the signal and where") {
  for (std::string how : {"abort", "segv", "null", "call_null", "two_threads", "overflow"}) {
    CAPTURE(how);
    Sandbox box;
    auto run = box.run(kTestPlugin + " --entry crash -n 2 --name c --config how=" + how);
    INFO(run.output);
    CHECK(run.exit_code == 1);
    auto error = read_json(box.run_dir("c") / "error.json");
    CHECK(error["kind"] == "signal");
    CHECK(error["rank"] == 1);
    const auto message = error["message"].get<std::string>();
    CHECK(message.find(how == "abort" ? "SIGABRT" : "SIGSEGV") != std::string::npos);
    CHECK(run.output.find("is about to crash") != std::string::npos);  // its last words
    // The handler's stack, symbolized: in the log, error.json and the root cause.
    const bool through_null = how == "null" || how == "two_threads";
    // A stack overflow: the handler read nothing from the overflowed stack
    // that would fault again, and wrote its report.
    const bool overflow = how == "overflow";
    const std::string place = through_null ? "in write_through_null(int volatile*) at "
                                             "test_plugin.cpp:"
                              : overflow   ? "in overflow_stack(int) at test_plugin.cpp:"
                                           : "in crash(train::Config const&) at test_plugin.cpp:";
    CHECK(message.find(place) != std::string::npos);
    REQUIRE(error.contains("stack"));
    CHECK(error["stack"].size() >= 2);
    CHECK(run.output.find("trainrun: fatal signal") != std::string::npos);
    CHECK(run.output.find("run failed: rank 1 (") != std::string::npos);
    std::ifstream log(box.run_dir("c") / "logs" / "worker-1.log");
    const std::string logged{std::istreambuf_iterator<char>(log), {}};
    CHECK(logged.find("trainrun: fatal signal") != std::string::npos);
    CHECK(logged.find(through_null ? "#0 write_through_null(int volatile*) at "
                      : overflow   ? "#0 overflow_stack(int) at "
                                   : " crash(train::Config const&) at ") != std::string::npos);
    // Two threads at once: the first one's report, and nothing of the second.
    size_t headers = 0;
    for (auto at = logged.find("trainrun: fatal signal"); at != std::string::npos;
         at = logged.find("trainrun: fatal signal", at + 1)) {
      ++headers;
    }
    if (how == "two_threads") CHECK(headers == 1);
    CHECK_FALSE(box.any_worker_alive());
  }
}

TEST_CASE("ranks that report a different number of times fail instead of hanging") {
  Sandbox box;
  auto run = box.run(kTestPlugin + " --entry mismatch -n 2 --name m");
  INFO(run.output);
  CHECK(run.exit_code == 1);
  CHECK(read_json(box.run_dir("m") / "error.json")["message"].get<std::string>().find(
            "same number of times") != std::string::npos);
  CHECK_FALSE(box.any_worker_alive());
}

TEST_CASE("a config value of the wrong type is an error naming the key") {
  Sandbox box;
  auto run = box.run(kTestPlugin + " --entry bad_config -n 1 --name b --config epochs=ten");
  CHECK(run.exit_code == 1);
  CHECK(run.output.find("config key 'epochs' is a string (\"ten\"), expected an integer") !=
        std::string::npos);
}

namespace {

// Starts a run of the `sleeps` entry and waits until both ranks print.
pid_t start_sleeping_run(const Sandbox& box, const std::string& extra) {
  pid_t pid = box.start(kTestPlugin + " --entry sleeps -n 2 --name s " + extra);
  for (int i = 0; i < 600; ++i) {
    auto out = box.output_so_far();
    if (out.find("[rank 0 (") != std::string::npos && out.find("[rank 1 (") != std::string::npos) {
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return pid;
}

}  // namespace

TEST_CASE("SIGINT stops every worker and exits 130") {
  Sandbox box;
  pid_t pid = start_sleeping_run(box, "");
  REQUIRE(box.any_worker_alive());
  ::kill(pid, SIGINT);
  CHECK(Sandbox::wait(pid) == 130);
  CHECK_FALSE(box.any_worker_alive());
  CHECK(read_json(box.run_dir("s") / "error.json")["kind"] == "interrupted");
}

TEST_CASE("a killed controller leaves no worker behind, nor what the train function started") {
  Sandbox box;
  pid_t pid = start_sleeping_run(box, "--config child=true");
  REQUIRE(box.worker_pids().size() == 2);
  std::vector<pid_t> children;
  std::regex child_line("child ([0-9]+)");
  auto out = box.output_so_far();
  for (std::sregex_iterator it(out.begin(), out.end(), child_line), end; it != end; ++it) {
    children.push_back(std::stoi((*it)[1]));
  }
  REQUIRE(children.size() == 2);
  ::kill(pid, SIGKILL);
  Sandbox::wait(pid);
  auto alive = [&] {
    bool any = box.any_worker_alive();
    for (pid_t child : children) {
      // Gone, or a zombie its dead parent left for init to collect.
      auto status = read_text("/proc/" + std::to_string(child) + "/stat");
      auto state = status.find(") ");
      if (state != std::string::npos && status[state + 2] != 'Z') any = true;
    }
    return any;
  };
  for (int i = 0; i < 100 && alive(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  CHECK_FALSE(alive());
}

TEST_CASE("a rank that never joins a collective fails the run at the collective timeout") {
  Sandbox box;
  auto started = std::chrono::steady_clock::now();
  auto run = box.run(kTestPlugin + " --entry hangs -n 2 --name hang --collective-timeout 2");
  INFO(run.output);
  CHECK(run.exit_code == 1);
  // Gloo's 30-minute default would hang the run; the heartbeats are fine throughout.
  CHECK(std::chrono::steady_clock::now() - started < std::chrono::seconds(60));
  auto error = read_json(box.run_dir("hang") / "error.json");
  CHECK(error["rank"] == 0);
  CHECK(error["message"].get<std::string>().find("Timed out") != std::string::npos);
  CHECK_FALSE(box.any_worker_alive());
}

TEST_CASE("a worker that stops responding is declared lost after the heartbeat timeout") {
  Sandbox box;
  pid_t pid = start_sleeping_run(box, "--heartbeat-timeout 2");
  auto workers = box.worker_pids();
  REQUIRE(workers.size() == 2);
  ::kill(workers[0], SIGSTOP);  // alive, but silent
  CHECK(Sandbox::wait(pid) == 1);
  auto error = read_json(box.run_dir("s") / "error.json");
  CHECK(error["kind"] == "lost");
  CHECK(error["pid"] == workers[0]);
  CHECK(error["message"].get<std::string>().find("stopped responding") != std::string::npos);
  CHECK_FALSE(box.any_worker_alive());
}

TEST_CASE("the quickstart example trains and its loss falls") {
  Sandbox box;
  auto run = box.run(std::string("--plugin '") + QUICKSTART_PLUGIN +
                     "' -n 2 --name q --config steps=30 --config lr=0.1");
  INFO(run.output);
  REQUIRE(run.exit_code == 0);
  auto results = read_jsonl(box.run_dir("q") / "result.jsonl");
  REQUIRE(results.size() == 30);
  CHECK(results.back()["metrics"]["loss"].get<double>() <
        0.1 * results.front()["metrics"]["loss"].get<double>());
}

TEST_CASE("workers cache the plugin by its sha256 and fetch a damaged copy again") {
  Sandbox box;
  REQUIRE(box.run(kTestPlugin + " --entry steps -n 2 --name a").exit_code == 0);
  auto sha = read_json(box.run_dir("a") / "run.json")["plugin"]["sha256"].get<std::string>();
  auto cached = box.root() / "cache" / (sha + ".so");
  REQUIRE(std::filesystem::exists(cached));
  auto size = std::filesystem::file_size(cached);
  REQUIRE(box.run(kTestPlugin + " --entry steps -n 2 --name b").exit_code == 0);
  CHECK(read_jsonl(box.run_dir("b") / "result.jsonl").size() == 1);

  std::filesystem::resize_file(cached, size / 2);  // a damaged cache entry
  auto run = box.run(kTestPlugin + " --entry steps -n 2 --name c");
  INFO(run.output);
  CHECK(run.exit_code == 0);
  CHECK(std::filesystem::file_size(cached) == size);  // fetched whole again
}

TEST_CASE("--config-file reaches the workers, and --config overrides it") {
  Sandbox box;
  std::ofstream(box.root() / "config.json") << R"({"reports": 2, "label": "from-file"})";
  auto run = box.run(kTestPlugin + " --entry context -n 2 --name f --config-file '" +
                     (box.root() / "config.json").string() + "' --config reports=1");
  INFO(run.output);
  REQUIRE(run.exit_code == 0);
  auto results = read_jsonl(box.run_dir("f") / "result.jsonl");
  REQUIRE(results.size() == 1);
  CHECK(results[0]["metrics"]["label"] == "from-file");
  CHECK(read_json(box.run_dir("f") / "run.json")["config"]["reports"] == 1);
}

TEST_CASE("an exception message longer than the limit is cut between characters, not inside one") {
  Sandbox box;
  auto run = box.run(kTestPlugin + " --entry throws -n 2 --name u --config long_utf8=true");
  INFO(run.output.substr(0, 2000));
  CHECK(run.exit_code == 1);
  auto message = read_json(box.run_dir("u") / "error.json")["message"].get<std::string>();
  REQUIRE(message.rfind("raised in ", 0) == 0);  // where it was thrown, then the message
  message.erase(0, message.find(": ") + 2);
  CHECK(message.rfind("\xc3\xa9", 0) == 0);
  CHECK(message.size() < 16 * 1024);
  CHECK(message.find("\xef\xbf\xbd") == std::string::npos);  // no replacement character
  CHECK(message.substr(message.size() - 2) == "\xc3\xa9");   // ends on a whole character
}

TEST_CASE("a report of more metrics than a report carries fails naming the limit") {
  Sandbox box;
  auto run = box.run(kTestPlugin + " --entry many_metrics -n 1 --name m --config count=10000");
  CHECK(run.exit_code == 1);
  CHECK(run.output.find("train::report: 10000 metrics; a report carries at most 4096") !=
        std::string::npos);
}

TEST_CASE("metric names and values cannot forge lines or colour the terminal") {
  Sandbox box;
  auto run = box.run(kTestPlugin + " --entry many_metrics -n 1 --name f --config forge=true");
  INFO(run.output);
  REQUIRE(run.exit_code == 0);
  auto results = box.run("results '" + box.run_dir("f").string() + "'");
  REQUIRE(results.exit_code == 0);
  for (const auto* out : {&run.output, &results.output}) {
    CHECK(out->find(
              "loss\\n[trainrun] run finished: forged=\\x1b[31mred\\r\\n[trainrun] forged too") !=
          std::string::npos);
    CHECK(out->find('\x1b') == std::string::npos);
    CHECK(out->find("\n[trainrun] run finished: forged") == std::string::npos);
    CHECK(out->find("\n[trainrun] forged too") == std::string::npos);
  }
}

TEST_CASE("a write to a socket whose peer is gone raises in the train function, not SIGPIPE") {
  // As a rank writing to the Gloo pair of a rank that died: the rank that
  // died is the root cause, not this one killed by a signal.
  Sandbox box;
  auto run = box.run(kTestPlugin + " --entry broken_pipe -n 1 --name p");
  INFO(run.output);
  CHECK(run.exit_code == 1);
  auto error = read_json(box.run_dir("p") / "error.json");
  CHECK(error["kind"] == "exception");
  const auto message = error["message"].get<std::string>();
  CHECK(message.rfind("raised in ", 0) == 0);
  CHECK(message.substr(message.size() - 20) == ": write: Broken pipe");
}
