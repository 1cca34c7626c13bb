// When a run goes wrong: a rank that never reaches a report, and every rank's
// stacks on request (`trainrun stacks`). A crash's stack is in test_runs.cpp,
// with the crashes.

#include <doctest/doctest.h>
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <thread>

#include "run_helpers.h"

namespace {

const std::string kTestPlugin = std::string("--plugin '") + TEST_PLUGIN + "'";

}  // namespace

TEST_CASE(
    "a rank that never reaches a report ends the run at the collective timeout, its "
    "threads' stacks on disk") {
  Sandbox box;
  // Rank 1 deadlocks two threads of its own; rank 0 waits in report 2.
  auto run = box.run(kTestPlugin + " --entry deadlock -n 2 --name d --collective-timeout 4");
  INFO(run.output);
  CHECK(run.exit_code == 1);
  auto error = read_json(box.run_dir("d") / "error.json");
  CHECK(error["kind"] == "timeout");
  CHECK(error["rank"] == 1);
  const auto message = error["message"].get<std::string>();
  CHECK(message.find("did not reach report 2 within the collective timeout (4 s) while rank 0 "
                     "waited there") != std::string::npos);
  CHECK(message.find("its train function was in deadlock(train::Config const&) at "
                     "test_plugin.cpp:") != std::string::npos);
  // Taken at half the timeout, before the run ended: both threads, in their locks.
  const auto stacks = read_text(box.run_dir("d") / "logs" / "stacks-1.txt");
  INFO(stacks);
  CHECK(stacks.find("rank 0 waited") != std::string::npos);
  CHECK(stacks.find("deadlock_first(") != std::string::npos);
  CHECK(stacks.find("deadlock_second(") != std::string::npos);
  CHECK(stacks.find("lock_in_order(") != std::string::npos);
  CHECK(stacks.find("rank 0 (") != std::string::npos);
  CHECK(stacks.find("(train_func):") != std::string::npos);
  CHECK(message.find(box.run_dir("d").string() + "/logs/stacks-1.txt") != std::string::npos);
  CHECK(run.seconds < 60);
  CHECK_FALSE(box.any_worker_alive());
}

TEST_CASE("trainrun stacks prints every thread of every rank of a live run") {
  Sandbox box;
  pid_t pid = box.start(kTestPlugin + " --entry sleeps -n 2 --name s");
  auto sleeping = [&] {  // both ranks in their train functions
    const auto out = box.output_so_far();
    size_t lines = 0;
    for (auto at = out.find("] sleeping"); at != std::string::npos;
         at = out.find("] sleeping", at + 1)) {
      ++lines;
    }
    return lines == 2;
  };
  for (int i = 0; i < 1200 && !sleeping(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  REQUIRE(sleeping());
  auto stacks = box.run_in_root("stacks results/s");
  INFO(stacks.output);
  CHECK(stacks.exit_code == 0);
  CHECK(stacks.output.find("asked for with SIGUSR1") != std::string::npos);
  for (const char* rank : {"rank 0 (", "rank 1 ("})
    CHECK(stacks.output.find(rank) != std::string::npos);
  CHECK(stacks.output.find("sleeps(train::Config const&) at ") != std::string::npos);
  CHECK(stacks.output.find("logs/stacks-1.txt") != std::string::npos);
  // Again: a file of its own.
  auto again = box.run_in_root("stacks results/s");
  CHECK(again.exit_code == 0);
  CHECK(again.output.find("logs/stacks-2.txt") != std::string::npos);
  ::kill(pid, SIGINT);
  CHECK(Sandbox::wait(pid) == 130);
  // A rerun of the name numbers its stacks after the earlier run's.
  std::filesystem::remove(box.root() / "out.txt");  // the first run's lines
  pid = box.start(kTestPlugin + " --entry sleeps -n 2 --name s");
  for (int i = 0; i < 1200 && !sleeping(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  REQUIRE(sleeping());
  auto rerun = box.run_in_root("stacks results/s");
  INFO(rerun.output);
  CHECK(rerun.exit_code == 0);
  CHECK(rerun.output.find("logs/stacks-3.txt") != std::string::npos);
  ::kill(pid, SIGINT);
  CHECK(Sandbox::wait(pid) == 130);
  // Without a live run, one line says so.
  auto after = box.run_in_root("stacks results/s");
  CHECK(after.exit_code == 2);
  CHECK(after.output == "trainrun: no run is live in results/s\n");
}
