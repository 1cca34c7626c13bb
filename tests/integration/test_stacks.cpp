// When a run goes wrong: a rank that never reaches a report, and every rank's
// stacks on request (`trainrun stacks`). A crash's stack is in test_runs.cpp,
// with the crashes.

#include <doctest/doctest.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <iterator>
#include <optional>
#include <string>
#include <thread>
#include <vector>

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

namespace {

// Whether some thread of `pid` is stopped (state T or t in its stat line).
bool any_thread_stopped(pid_t pid) {
  const auto tasks = std::filesystem::path("/proc") / std::to_string(pid) / "task";
  std::error_code error;
  for (const auto& task : std::filesystem::directory_iterator(tasks, error)) {
    const auto stat = read_text(task.path() / "stat");
    const auto close = stat.rfind(')');  // the name may hold spaces and parentheses
    if (close != std::string::npos && close + 2 < stat.size() &&
        (stat[close + 2] == 'T' || stat[close + 2] == 't')) {
      return true;
    }
  }
  return false;
}

// Thread `tid` of `pid`'s state letter (R, S, D, T, ...), or 0.
char thread_state(pid_t pid, pid_t tid) {
  const auto stat = read_text(std::filesystem::path("/proc") / std::to_string(pid) / "task" /
                              std::to_string(tid) / "stat");
  const auto close = stat.rfind(')');
  return close != std::string::npos && close + 2 < stat.size() ? stat[close + 2] : 0;
}

// The pid tracing thread `tid` of `pid` (0: none).
pid_t tracer_of(pid_t pid, pid_t tid) {
  const auto status = read_text(std::filesystem::path("/proc") / std::to_string(pid) / "task" /
                                std::to_string(tid) / "status");
  const auto at = status.find("TracerPid:");
  return at == std::string::npos ? 0 : std::atoi(status.c_str() + at + 10);
}

// A child that sleeps a while, and the wait for it in vfork(): a stop signal
// sent to the waiting thread stays pending until the child ends.
__attribute__((noinline)) void vfork_once() {
  const pid_t child = ::vfork();
  if (child == 0) {
    const struct timespec pause { 0, 200'000'000 };
    ::syscall(SYS_nanosleep, &pause, nullptr);
    ::_exit(0);
  }
  if (child > 0) ::waitpid(child, nullptr, 0);
}

}  // namespace

TEST_CASE("a stack-walking helper killed while it stops the threads leaves none of them stopped") {
  // A stand-in for a worker: threads that sleep, and one that waits in
  // vfork() most of the time, as a thread in a system call that a signal
  // does not interrupt. PTRACE_ATTACH's SIGSTOP would wait there, and stop
  // the whole process after the helper that sent it died.
  int tid_pipe[2];
  REQUIRE(::pipe(tid_pipe) == 0);
  const pid_t target = ::fork();
  REQUIRE(target >= 0);
  if (target == 0) {
    // A sibling may trace it where Yama allows only ancestors (the worker
    // names its helper so).
    ::prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
    std::vector<std::thread> threads;
    for (int i = 0; i < 2; ++i) {
      threads.emplace_back([] {
        for (int n = 0; n < 6000; ++n) std::this_thread::sleep_for(std::chrono::milliseconds(10));
      });
    }
    threads.emplace_back([&] {
      const pid_t tid = static_cast<pid_t>(::syscall(SYS_gettid));
      [[maybe_unused]] auto sent = ::write(tid_pipe[1], &tid, sizeof(tid));
      for (int n = 0; n < 300; ++n) vfork_once();
    });
    for (auto& thread : threads) thread.join();
    ::_exit(0);
  }
  // Ended however the test ends.
  struct Reaper {
    pid_t pid;
    ~Reaper() {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
  } reaper{target};
  pid_t vforking = 0;
  REQUIRE(::read(tid_pipe[0], &vforking, sizeof(vforking)) == sizeof(vforking));
  ::close(tid_pipe[0]);
  ::close(tid_pipe[1]);
  const auto helper_exe =
      (std::filesystem::path(TRAINRUN_EXE).parent_path() / "trainrun-worker").string();
  const auto target_pid = std::to_string(target);
  // Runs the helper on the target; with `kill`, kills it once it traces the
  // vforking thread while that thread waits in vfork(), or once the bound
  // passes. Returns what it wrote, and whether it was killed in that state.
  auto walk = [&](bool kill) {
    int go[2], out[2];
    REQUIRE(::pipe2(go, O_CLOEXEC) == 0);
    REQUIRE(::pipe2(out, O_CLOEXEC) == 0);
    const pid_t helper = ::fork();
    REQUIRE(helper >= 0);
    if (helper == 0) {
      ::dup2(go[0], STDIN_FILENO);
      ::dup2(out[1], STDOUT_FILENO);
      ::execl(helper_exe.c_str(), "trainrun-worker", "--walk-stacks", target_pid.c_str(), "5000",
              static_cast<char*>(nullptr));
      ::_exit(127);
    }
    ::close(go[0]);
    ::close(out[1]);
    CHECK(::write(go[1], "g", 1) == 1);
    bool caught = false;
    bool reaped = false;
    if (kill) {
      // The window is the 100 ms the helper waits on that thread; a starved
      // test process can miss it, and the round is then tried again.
      for (int i = 0; i < 2000; ++i) {
        caught = tracer_of(target, vforking) == helper && thread_state(target, vforking) == 'D';
        reaped = !caught && ::waitpid(helper, nullptr, WNOHANG) == helper;
        if (caught || reaped) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      if (!reaped) ::kill(helper, SIGKILL);
    }
    std::string text;
    char buffer[4096];
    for (ssize_t n; (n = ::read(out[0], buffer, sizeof(buffer))) > 0;) text.append(buffer, n);
    if (!reaped) ::waitpid(helper, nullptr, 0);
    ::close(go[1]);
    ::close(out[0]);
    return std::pair{text, caught};
  };
  while (std::distance(std::filesystem::directory_iterator("/proc/" + target_pid + "/task"),
                       std::filesystem::directory_iterator{}) < 4) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  // Left alone, it walks every thread it can stop: the three that sleep at
  // least (the one in vfork() may be passed over after 100 ms), with frames.
  const auto whole = walk(false).first;
  INFO(whole);
  size_t threads = 0;
  for (auto at = whole.find("T "); at != std::string::npos; at = whole.find("\nT ", at + 1)) {
    ++threads;
  }
  CHECK(threads >= 3);
  CHECK(whole.find("\nF ") != std::string::npos);
  // Killed while it traces the vforking thread, a few times over: once the
  // vfork has ended (200 ms), no thread of the target is stopped. A helper
  // killed elsewhere in its walk must leave none stopped either, so every
  // kill is checked; tries that missed the window are bounded.
  int caught_rounds = 0;
  for (int attempt = 0; attempt < 12 && caught_rounds < 3; ++attempt) {
    CAPTURE(attempt);
    caught_rounds += walk(true).second ? 1 : 0;
    std::this_thread::sleep_for(std::chrono::milliseconds(400));
    bool stopped = any_thread_stopped(target);
    for (int i = 0; i < 100 && stopped; ++i) {  // a ptrace stop being let go
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      stopped = any_thread_stopped(target);
    }
    CHECK_FALSE(stopped);
    if (stopped) break;
  }
  if (caught_rounds == 0) {
    WARN_MESSAGE(false, "no helper was caught in the vforking thread's wait (a starved machine)");
  }
}
