// The controller against scripted fake workers that speak the protocol without
// LibTorch: the happy path, and workers that go out of step, return early,
// exit, send garbage, fall silent or raise.

#include <doctest/doctest.h>
#include <pthread.h>

#include <csignal>
#include <cstdlib>
#include <fstream>

#include "../unit/temp_dir.h"
#include "fake_runs.h"
#include "storage/run_directory.h"

using namespace trainrun;

namespace {

Result run(const TempDir& tmp, int workers, nlohmann::json script,
           std::chrono::milliseconds heartbeat = std::chrono::seconds(30)) {
  auto options = fake_options(tmp.path, workers, std::move(script));
  options.run.heartbeat_timeout = heartbeat;
  return Trainer(options).fit();
}

}  // namespace

TEST_CASE("fake workers: every report is recorded with rank 0's metrics and the run finishes") {
  TempDir tmp;
  auto result = run(tmp, 4, {{"reports", 5}});
  REQUIRE_FALSE(result.error);
  CHECK(result.iterations == 5);
  REQUIRE(result.history.size() == 5);
  for (int i = 0; i < 5; ++i) {
    CHECK(result.history[static_cast<size_t>(i)].iteration == i + 1);
    CHECK(result.history[static_cast<size_t>(i)].metrics["i"] == i + 1);
    CHECK(result.history[static_cast<size_t>(i)].metrics["rank"] == 0);
  }
  auto dir = tmp.path / "results" / "fake";
  CHECK(read_lines(dir / "result.jsonl").size() == 5);
  auto info = run_directory::read_run_info(dir);
  REQUIRE(info);
  CHECK(info->status == RunStatus::kFinished);
  CHECK(info->scaling.num_workers == 4);
  CHECK_FALSE(std::filesystem::exists(dir / "error.json"));
  // The plugin went through the chunk pull into the cache, once per sha256.
  int cached = 0;
  for (const auto& entry : std::filesystem::directory_iterator(tmp.path / "cache")) {
    cached += entry.path().extension() == ".so";
  }
  CHECK(cached == 1);
}

TEST_CASE("fake workers: a rank that reports out of step fails the run as a usage error") {
  TempDir tmp;
  auto result = run(tmp, 3, {{"reports", 3}, {"skip_rank", 1}});
  REQUIRE(result.error);
  CHECK(result.error->kind == FailureKind::kUsage);
  CHECK(result.error->rank == 1);
  CHECK(result.error->message.find("reported iteration 2 while the run is at iteration 1") !=
        std::string::npos);
  auto error = run_directory::read_error(tmp.path / "results" / "fake");
  REQUIRE(error);
  CHECK(error->kind == FailureKind::kUsage);
}

TEST_CASE("fake workers: a rank that returns while others wait in report is named") {
  TempDir tmp;
  auto result = run(tmp, 3, {{"reports", 3}, {"short_rank", 2}, {"short_after", 1}});
  REQUIRE(result.error);
  CHECK(result.error->kind == FailureKind::kUsage);
  CHECK(result.error->rank == 2);
  CHECK(result.error->message.find("returned from train_func after 1 report while rank") !=
        std::string::npos);
  CHECK(result.iterations == 1);  // the report every rank made is recorded
}

TEST_CASE("fake workers: a rank that exits mid-run is the root cause, with its exit code") {
  TempDir tmp;
  auto result = run(tmp, 3, {{"reports", 5}, {"exit_rank", 1}, {"exit_after", 2}});
  REQUIRE(result.error);
  CHECK(result.error->kind == FailureKind::kExit);
  CHECK(result.error->rank == 1);
  CHECK(result.error->message == "exited with code 3 before finishing");
  CHECK(result.iterations == 2);
  CHECK(run_directory::read_run_info(tmp.path / "results" / "fake")->status == RunStatus::kFailed);
}

TEST_CASE("fake workers: frames that are not a message are dropped and the run goes on") {
  TempDir tmp;
  auto result = run(tmp, 2, {{"reports", 2}, {"garbage_rank", 0}});
  CHECK_FALSE(result.error);
  CHECK(result.iterations == 2);
  auto log = read_lines(tmp.path / "results" / "fake" / "logs" / "controller.log");
  bool dropped = false;
  for (const auto& line : log)
    dropped |= line.find("dropped a message from rank 0") != std::string::npos;
  CHECK(dropped);
}

TEST_CASE("fake workers: a rank that falls silent is declared lost") {
  TempDir tmp;
  auto result = run(tmp, 2, {{"reports", 3}, {"silent_rank", 1}, {"silent_after", 1}},
                    std::chrono::seconds(2));
  REQUIRE(result.error);
  CHECK(result.error->kind == FailureKind::kLost);
  CHECK(result.error->rank == 1);
  CHECK(result.wall_seconds < 15);  // stopped with SIGTERM, not waited out
}

TEST_CASE("fake workers: slow reports still meet at the barrier") {
  TempDir tmp;
  auto result = run(tmp, 3, {{"reports", 3}, {"report_delay_ms", 150}});
  REQUIRE_FALSE(result.error);
  REQUIRE(result.history.size() == 3);
  CHECK(result.history[2].time_total_s > result.history[0].time_total_s + 0.2);
}

TEST_CASE("fake workers: a rank that raises is named with its message") {
  TempDir tmp;
  auto result = run(tmp, 2, {{"reports", 2}, {"fail_rank", 0}});
  REQUIRE(result.error);
  CHECK(result.error->kind == FailureKind::kException);
  CHECK(result.error->rank == 0);
  CHECK(result.error->message == "raised: scripted failure");
  CHECK(result.error->summary().find("rank 0 (localhost, pid ") == 0);
}

TEST_CASE("fake workers: output without a newline is forwarded in bounded pieces") {
  TempDir tmp;
  auto result = run(tmp, 2, {{"reports", 2}, {"spam_mib", 64}});
  REQUIRE_FALSE(result.error);
  auto lines = read_lines(tmp.path / "results" / "fake" / "logs" / "worker-0.log");
  REQUIRE(lines.size() == 1024);  // 64 MiB in 64 KiB pieces
  CHECK(lines.front().size() == 64 * 1024);
  CHECK_FALSE(std::filesystem::exists(tmp.path / "results" / "fake" / "logs" / "worker-1.log"));
}

TEST_CASE("fake workers: a DONE sent while its own report waits is dropped, not a usage error") {
  TempDir tmp;
  auto result = run(
      tmp, 3, {{"reports", 2}, {"early_done_rank", 0}, {"slow_rank", 2}, {"report_delay_ms", 300}});
  CHECK_FALSE(result.error);
  CHECK(result.iterations == 2);
}

TEST_CASE("fake workers: an exit is seen though the launcher blocked SIGCHLD") {
  TempDir tmp;
  sigset_t chld, before;
  sigemptyset(&chld);
  sigaddset(&chld, SIGCHLD);
  ::pthread_sigmask(SIG_BLOCK, &chld, &before);
  auto result = run(tmp, 3, {{"reports", 5}, {"exit_rank", 2}, {"exit_after", 1}});
  ::pthread_sigmask(SIG_SETMASK, &before, nullptr);
  REQUIRE(result.error);
  CHECK(result.error->kind == FailureKind::kExit);  // not a peer's error, not "lost"
  CHECK(result.error->rank == 2);
}

TEST_CASE("fake workers: a controller pid inherited from the environment is not taken") {
  TempDir tmp;
  ::setenv("TRAINRUN_CONTROLLER_PID", "1", 1);  // as if this process had been a worker
  auto result = run(tmp, 2, {{"reports", 1}});
  ::unsetenv("TRAINRUN_CONTROLLER_PID");
  CHECK_FALSE(result.error);
}

TEST_CASE(
    "fake workers: a one-second heartbeat timeout works, a shorter one than 100 ms is refused") {
  TempDir tmp;
  auto result = run(tmp, 2, {{"reports", 4}, {"report_delay_ms", 400}}, std::chrono::seconds(1));
  CHECK_FALSE(result.error);  // heartbeats every 250 ms, not every second
  auto options = fake_options(tmp.path, 2, nlohmann::json::object());
  options.run.heartbeat_timeout = std::chrono::milliseconds(50);
  CHECK_THROWS_WITH_AS(Trainer{options}, doctest::Contains("at least 0.1 s"), UsageError);
}

TEST_CASE("fake workers: a rank's scratch directory goes when it ends, however it ends") {
  TempDir tmp;
  auto result =
      run(tmp, 2, {{"reports", 3}, {"scratch", true}, {"exit_rank", 1}, {"exit_after", 1}});
  REQUIRE(result.error);
  for (int rank = 0; rank < 2; ++rank) {
    CAPTURE(rank);
    auto lines = read_lines(tmp.path / "results" / "fake" / "logs" /
                            ("worker-" + std::to_string(rank) + ".log"));
    REQUIRE_FALSE(lines.empty());
    REQUIRE(lines[0].rfind("scratch ", 0) == 0);
    std::filesystem::path scratch = lines[0].substr(8);
    CHECK(scratch.filename() == "worker-" + std::to_string(rank));  // TMPDIR was its own
    CHECK_FALSE(std::filesystem::exists(scratch));
  }
}

TEST_CASE("fake workers: what a train function started ends with the run, on success too") {
  TempDir tmp;
  auto result = run(tmp, 2, {{"reports", 1}, {"orphan_rank", 0}});
  REQUIRE_FALSE(result.error);
  auto lines = read_lines(tmp.path / "results" / "fake" / "logs" / "worker-0.log");
  REQUIRE_FALSE(lines.empty());
  REQUIRE(lines[0].rfind("child ", 0) == 0);
  pid_t child = std::stoi(lines[0].substr(6));
  // Dead: gone, or a zombie waiting for whoever adopted it.
  std::ifstream stat("/proc/" + std::to_string(child) + "/stat");
  std::string pid, comm, state;
  bool alive = static_cast<bool>(stat >> pid >> comm >> state) && state != "Z";
  CHECK_FALSE(alive);
}

TEST_CASE("fake workers: a dead controller's private directory is removed at the next start") {
  TempDir tmp;
  auto stale = std::filesystem::temp_directory_path() / "trainrun-controller-999999999-Ab1Cd2";
  std::filesystem::create_directories(stale / "worker-0");
  auto result = run(tmp, 1, {{"reports", 1}});
  CHECK_FALSE(result.error);
  CHECK_FALSE(std::filesystem::exists(stale));
}

TEST_CASE("fake workers: a rank that never starts its train function fails the run at startup") {
  TempDir tmp;
  auto options = fake_options(tmp.path, 2, {{"reports", 2}, {"stuck_rank", 1}});
  options.run.startup_timeout = std::chrono::seconds(2);
  auto result = Trainer(options).fit();
  REQUIRE(result.error);
  CHECK(result.error->kind == FailureKind::kSetup);
  CHECK(result.error->rank == 1);
  CHECK(result.error->message.find("did not start its train function within 2 s") !=
        std::string::npos);
}

TEST_CASE("fake workers: metrics nested without end fail that rank, and the controller stands") {
  TempDir tmp;
  auto result = run(tmp, 2, {{"reports", 2}, {"deep_metrics", 100000}});
  REQUIRE(result.error);
  CHECK(result.error->kind == FailureKind::kUsage);
  CHECK(result.error->rank == 0);
  CHECK(result.error->message.find("reported metrics that are not a map of names") !=
        std::string::npos);
  CHECK(result.status == RunStatus::kFailed);
}

TEST_CASE("fake workers: a progress line with carriage returns keeps its prefix") {
  TempDir tmp;
  auto result = run(tmp, 1, {{"reports", 1}, {"progress", true}});
  REQUIRE_FALSE(result.error);
  auto lines = read_lines(tmp.path / "results" / "fake" / "logs" / "worker-0.log");
  REQUIRE(lines.size() == 2);
  CHECK(lines[0] == "step 3/3");  // what a terminal shows of "step 1/3\rstep 2/3\rstep 3/3"
  CHECK(lines[1] == "windows line");
}

TEST_CASE("fake workers: mutated messages of every type from a rank end the run cleanly") {
  for (int seed = 1; seed <= 4; ++seed) {
    TempDir tmp;
    auto result = run(
        tmp, 2, {{"reports", 3}, {"fuzz_rank", 1}, {"fuzz_messages", 3000}, {"fuzz_seed", seed}});
    INFO("seed " << seed);
    // A mutated message can be a valid one that ends the run (a FAILED, a
    // REPORT out of step): that is a clean end. Never an internal error, and
    // always a final status that agrees with error.json.
    auto dir = tmp.path / "results" / "fake";
    auto info = run_directory::read_run_info(dir);
    REQUIRE(info);
    CHECK(info->status == result.status);
    if (result.error) {
      MESSAGE("seed " << seed << ": " << to_string(result.error->kind) << ": "
                      << result.error->message);
      CHECK(result.error->kind != FailureKind::kInternal);
      CHECK(result.status == RunStatus::kFailed);
      CHECK(std::filesystem::exists(dir / "error.json"));
    } else {
      CHECK(result.status == RunStatus::kFinished);
    }
  }
  // This process was the controller of every run: its peak memory stayed small.
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("VmHWM:", 0) == 0) CHECK(std::stod(line.substr(6)) / 1024.0 < 256);
  }
}
