#include <doctest/doctest.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <thread>

#include "common/fd.h"
#include "common/signals.h"
#include "controller/event_loop.h"
#include "controller/failure.h"
#include "controller/rank_assignment.h"
#include "controller/report_barrier.h"
#include "controller/report_coordinator.h"
#include "controller/run_phase.h"

using namespace trainrun;

TEST_CASE("failures: a dead process is the root cause over a peer's exception") {
  FailureCollector failures;
  const auto start = FailureCollector::Clock::now();
  CHECK_FALSE(failures.any());
  failures.add({FailureKind::kException, "raised: Connection closed by peer", 0, "h", 10}, start);
  failures.add({FailureKind::kSignal, "was killed by SIGSEGV", 1, "h", 11}, start);
  failures.add({FailureKind::kException, "raised: later", 2, "h", 12}, start);
  CHECK(failures.root_cause().rank == 1);
  // A dead process settles it at once: nothing later can outrank it.
  CHECK(failures.settled(start, std::chrono::hours(1)));
}

TEST_CASE("failures: exceptions and lost heartbeats wait for the grace period") {
  FailureCollector failures;
  const auto start = FailureCollector::Clock::now();
  failures.add({FailureKind::kException, "raised: Connection closed by peer", 0, "h", 10}, start);
  failures.add({FailureKind::kLost, "sent nothing", 1, "h", 11}, start);
  CHECK(failures.root_cause().rank == 1);
  CHECK_FALSE(failures.settled(start, std::chrono::hours(1)));
  CHECK(failures.settled(start + std::chrono::seconds(1), std::chrono::milliseconds(1)));
}

TEST_CASE("failures: among exceptions the earliest wins") {
  FailureCollector failures;
  const auto start = FailureCollector::Clock::now();
  failures.add({FailureKind::kException, "raised: first", 1, "h", 11}, start);
  failures.add({FailureKind::kException, "raised: second", 0, "h", 10}, start);
  CHECK(failures.root_cause().message == "raised: first");
}

TEST_CASE("report barrier: completes when every rank arrives and keeps rank 0 metrics") {
  ReportBarrier barrier(3);
  CHECK_FALSE(barrier.arrive(1, 1, {{"loss", 9}}));
  CHECK_FALSE(barrier.arrive(0, 1, {{"loss", 1}}));
  CHECK_FALSE(barrier.complete());
  CHECK(barrier.waiting(0));
  CHECK_FALSE(barrier.waiting(2));
  CHECK_FALSE(barrier.arrive(2, 1, {}));
  CHECK(barrier.complete());
  CHECK(barrier.release() == nlohmann::json{{"loss", 1}});
  CHECK(barrier.iteration() == 2);
  CHECK_FALSE(barrier.waiting(0));
  auto error = barrier.arrive(1, 5, {});
  REQUIRE(error);
  CHECK(error->find("rank 1 reported iteration 5 while the run is at iteration 2") == 0);
}

TEST_CASE("report barrier: while rank 0 is out of the group, the lowest rank's metrics count") {
  ReportBarrier barrier(3);
  CHECK_FALSE(barrier.arrive(2, 1, {{"loss", 2}}));
  CHECK_FALSE(barrier.arrive(1, 1, {{"loss", 1}}));
  barrier.depart(0);  // lost before it reported
  REQUIRE(barrier.complete());
  CHECK(barrier.release() == nlohmann::json{{"loss", 1}});
  // Rank 0's replacement is back: its metrics count again.
  barrier.rejoin(0);
  CHECK_FALSE(barrier.arrive(1, 2, {{"loss", 1}}));
  CHECK_FALSE(barrier.arrive(0, 2, {{"loss", 0}}));
  CHECK_FALSE(barrier.arrive(2, 2, {{"loss", 2}}));
  CHECK(barrier.release() == nlohmann::json{{"loss", 0}});
  // Rank 0 reported, then was lost: what it reported stays.
  CHECK_FALSE(barrier.arrive(0, 3, {{"loss", 0}}));
  barrier.depart(0);
  CHECK_FALSE(barrier.arrive(1, 3, {{"loss", 1}}));
  CHECK_FALSE(barrier.arrive(2, 3, {{"loss", 2}}));
  CHECK(barrier.release() == nlohmann::json{{"loss", 0}});
}

TEST_CASE("signal names") {
  CHECK(signal_description(SIGSEGV) == "SIGSEGV (Segmentation fault)");
  CHECK(signal_description(SIGABRT) == "SIGABRT (Aborted)");
}

TEST_CASE("ranks are grouped by host so local and node ranks are right on every node") {
  auto placements = assign_ranks({"b", "a", "b", "a", "b"});
  REQUIRE(placements.size() == 5);
  auto check = [&](size_t i, int world, int local, int node, int local_size) {
    CAPTURE(i);
    CHECK(placements[i].world_rank == world);
    CHECK(placements[i].local_rank == local);
    CHECK(placements[i].node_rank == node);
    CHECK(placements[i].local_world_size == local_size);
  };
  check(0, 0, 0, 0, 3);  // host b appeared first: node 0
  check(2, 1, 1, 0, 3);
  check(4, 2, 2, 0, 3);
  check(1, 3, 0, 1, 2);
  check(3, 4, 1, 1, 2);
  auto local = assign_ranks({"h", "h"});
  CHECK(local[1].world_rank == 1);
  CHECK(local[1].local_rank == 1);
  CHECK(local[1].local_world_size == 2);
}

TEST_CASE("report coordinator: records continue earlier runs and carry rank 0's metrics") {
  ReportCoordinator reports(2, 10);
  CHECK_FALSE(reports.arrive(1, 1, {}));
  CHECK_FALSE(reports.complete());
  CHECK_FALSE(reports.stalled());
  CHECK_FALSE(reports.arrive(0, 1, {{"loss", 0.5}}));
  REQUIRE(reports.complete());
  auto record = reports.release();
  CHECK(record.iteration == 11);
  CHECK(record.metrics == nlohmann::json{{"loss", 0.5}});
  CHECK(reports.iteration() == 2);
  CHECK(reports.arrive(0, 3, {}));  // out of step
}

TEST_CASE("report coordinator: a rank that returns while another waits is blamed") {
  ReportCoordinator reports(3, 0);
  reports.finished(2);
  CHECK_FALSE(reports.stalled());  // ranks 0 and 1 still train
  CHECK_FALSE(reports.arrive(0, 1, {}));
  CHECK_FALSE(reports.stalled());  // rank 1 still trains
  CHECK_FALSE(reports.arrive(1, 1, {}));
  auto stalled = reports.stalled();
  REQUIRE(stalled);
  CHECK(stalled->first == 2);
  CHECK(stalled->second ==
        "returned from train_func after 0 reports while rank 0 waits in report 1: every rank "
        "must call train::report the same number of times");
}

TEST_CASE("report coordinator: ranks meet before a report, and one that returned is blamed there") {
  ReportCoordinator reports(2, 0);
  CHECK_FALSE(reports.arrive_early(0, 1));
  CHECK(reports.waiting(0));
  CHECK_FALSE(reports.early_complete());
  CHECK_FALSE(reports.arrive_early(1, 1));
  REQUIRE(reports.early_complete());
  reports.release_early();
  CHECK_FALSE(reports.waiting(0));
  for (int rank : {0, 1}) CHECK_FALSE(reports.arrive(rank, 1, {}));
  REQUIRE(reports.complete());
  (void)reports.release();

  CHECK_FALSE(reports.arrive_early(0, 2));
  reports.finished(1);
  auto stalled = reports.stalled();
  REQUIRE(stalled);
  CHECK(stalled->first == 1);
  CHECK(stalled->second.find("returned from train_func after 1 report while rank 0 waits in "
                             "report 2") == 0);
}

TEST_CASE("report coordinator: a report or an arrival out of step with the others is an error") {
  ReportCoordinator reports(2, 0);
  CHECK(reports.arrive_early(0, 2));  // the run is at report 1
  CHECK_FALSE(reports.arrive_early(0, 1));
  CHECK(reports.arrive_early(0, 1));      // twice
  auto error = reports.arrive(1, 1, {});  // without arriving first
  REQUIRE(error);
  CHECK(error->find("rank 1 reported iteration 1 without waiting for every rank before it") == 0);

  ReportCoordinator other(2, 0);
  CHECK_FALSE(other.arrive(0, 1, {}));
  error = other.arrive_early(1, 1);  // rank 0 reported without arriving
  REQUIRE(error);
  CHECK(error->find("rank 0 reported iteration 1 without waiting") == 0);
}

TEST_CASE("report coordinator: a thousand ranks, in any order, complete each report") {
  ReportCoordinator reports(1024, 0);
  for (int round = 1; round <= 3; ++round) {
    for (int rank = 1023; rank >= 0; --rank) CHECK_FALSE(reports.arrive(rank, round, {}));
    REQUIRE(reports.complete());
    CHECK(reports.release().iteration == round);
  }
}

TEST_CASE("run phases: an attempt goes forward, any phase can stop, and an ended run stays ended") {
  using P = RunPhase;
  const P all[] = {P::kGathering,  P::kTraining,   P::kRegrouping, P::kFailing,
                   P::kRestarting, P::kBackingOff, P::kStopping,   P::kEnded};
  // The path of a run that fails once, backs off, regroups later and finishes.
  const P path[] = {P::kGathering, P::kFailing,  P::kRestarting, P::kBackingOff,
                    P::kGathering, P::kTraining, P::kRegrouping, P::kRestarting,
                    P::kGathering, P::kTraining, P::kStopping,   P::kEnded};
  for (size_t i = 0; i + 1 < std::size(path); ++i) {
    CAPTURE(i);
    CHECK(phase_allows(path[i], path[i + 1]));
  }
  for (P from : all) {
    CAPTURE(to_string(from));
    CHECK_FALSE(phase_allows(from, from));  // staying is not a move
    CHECK(phase_allows(from, P::kStopping) == (from != P::kStopping && from != P::kEnded));
    CHECK_FALSE(phase_allows(P::kEnded, from));
  }
  // What a failing attempt may not do: record again, or regroup.
  CHECK_FALSE(phase_allows(P::kFailing, P::kTraining));
  CHECK_FALSE(phase_allows(P::kFailing, P::kRegrouping));
  CHECK_FALSE(phase_allows(P::kTraining, P::kGathering));
  CHECK_FALSE(phase_allows(P::kBackingOff, P::kTraining));
}

TEST_CASE("event loop: the handlers of ready sources run, and one removed by another does not") {
  Fd first(::eventfd(1, EFD_CLOEXEC | EFD_NONBLOCK));  // readable
  Fd second(::eventfd(1, EFD_CLOEXEC | EFD_NONBLOCK));
  Fd idle(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  REQUIRE((first && second && idle));
  EventLoop loop;
  int first_runs = 0, second_runs = 0, idle_runs = 0;
  EventLoop::Id second_id = 0;
  loop.watch(first.get(), [&] {
    ++first_runs;
    loop.unwatch(second_id);
  });
  second_id = loop.watch(second.get(), [&] { ++second_runs; });
  loop.watch(idle.get(), [&] { ++idle_runs; });
  loop.watch(-1, [&] { FAIL("a negative descriptor is never ready"); });
  CHECK(loop.wait(std::chrono::milliseconds(100)) == 2);
  CHECK(first_runs == 1);
  CHECK(second_runs == 0);  // first's handler removed it before its turn
  CHECK(idle_runs == 0);
  CHECK(loop.wait(std::chrono::milliseconds(0)) == 1);  // first is still readable
  CHECK(second_runs == 0);
}
