// The controller's restarts, elastic growth, asynchronous commits and stops,
// driven in this process by scripted peers over inproc:// with a clock the
// test moves: each scenario runs in milliseconds, without a process. The
// process-level tests (tests/controller/test_controller.cpp, tests/integration)
// prove the same paths with real workers.

#include <doctest/doctest.h>

#include <algorithm>
#include <csignal>
#include <fstream>
#include <map>

#include "../unit/temp_dir.h"
#include "common/hash.h"
#include "inproc_harness.h"

using namespace trainrun;
using namespace trainrun::testing;
using namespace std::chrono_literals;

namespace {

// The lines of result.jsonl, as JSON.
std::vector<nlohmann::json> results(const RunStorage& storage) {
  std::ifstream in(storage.dir() / "result.jsonl");
  std::vector<nlohmann::json> records;
  for (std::string line; std::getline(in, line);) records.push_back(nlohmann::json::parse(line));
  return records;
}

std::string read_text(const std::filesystem::path& path) {
  std::ifstream in(path);
  return {std::istreambuf_iterator<char>(in), {}};
}

// The checkpoint directories the run committed.
std::vector<std::string> checkpoints(const RunStorage& storage) {
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(storage.dir())) {
    auto name = entry.path().filename().string();
    if (entry.is_directory() && name.rfind("checkpoint_", 0) == 0) names.push_back(name);
  }
  return names;
}

TrainerOptions options(int workers) {
  TrainerOptions options;
  options.scaling.num_workers = workers;
  options.run.heartbeat_timeout = 10s;
  options.run.startup_timeout = 30s;
  options.failure.max_failures = 1;
  return options;
}

// A worker that connects, takes its rank and starts its train function.
protocol::Assign join(ScriptedWorker& worker, int attempt = 0) {
  worker.hello(attempt);
  auto assign = worker.main.expect<protocol::Assign>();
  worker.start(assign);
  return assign;
}

// Reports once, says DONE and is told to shut down: the run finished.
void finish(ScriptedWorker& worker, int64_t iteration = 1) {
  worker.report(iteration);
  CHECK(worker.train->expect<protocol::ReportAck>().iteration >= 1);
  worker.train->send(protocol::Done{iteration});
}

}  // namespace

TEST_CASE("in-process controller: two workers report, finish, and are shut down") {
  TempDir tmp;
  InprocRun run(tmp.path, options(2));
  auto a = run.worker("node-a", 101);
  auto b = run.worker("node-b", 102);
  a.hello();
  CHECK_FALSE(a.main.has_message(5ms));  // the ranks wait for every worker
  b.hello();
  auto assign_a = a.main.expect<protocol::Assign>();
  auto assign_b = b.main.expect<protocol::Assign>();
  a.start(assign_a);
  b.start(assign_b);
  CHECK(assign_a.world_size == 2);
  CHECK(assign_a.world_rank != assign_b.world_rank);
  CHECK(assign_a.store_prefix == "trainrun/attempt-1");
  a.report(1);
  CHECK_FALSE(a.train->has_message(5ms));  // the barrier waits for b
  b.report(1);
  CHECK(a.train->expect<protocol::ReportAck>().iteration == 1);
  CHECK(b.train->expect<protocol::ReportAck>().iteration == 1);
  a.train->send(protocol::Done{1});
  b.train->send(protocol::Done{1});
  CHECK(a.main.expect<protocol::Shutdown>().reason == "finished");
  auto outcome = run.outcome();
  CHECK_FALSE(outcome.error);
  REQUIRE(outcome.attempts.size() == 1);
  CHECK(outcome.attempts[0].world_size == 2);
  REQUIRE(results(run.storage()).size() == 1);
  CHECK(results(run.storage())[0]["metrics"]["step"] == 1);
}

TEST_CASE("in-process controller: a worker that falls silent is lost, and the next attempt runs") {
  TempDir tmp;
  InprocRun run(tmp.path, options(1));
  auto first = run.worker("node-a", 101);
  join(first);
  // It sends nothing more: past the heartbeat timeout and the grace period it
  // is lost, and its attempt ends with a restart.
  auto shutdown = first.main.expect<protocol::Shutdown>(&run.clock(), 500ms);
  CHECK(shutdown.restart);
  CHECK(run.logged("sent nothing for 10 s: stopped responding"));

  REQUIRE(run.wait_for_log("attempt 2 starts from the start"));
  auto second = run.worker("node-a", 102);
  auto assign = join(second);
  CHECK(assign.store_prefix == "trainrun/attempt-2");  // a store of its own
  finish(second);
  CHECK(second.main.expect<protocol::Shutdown>().reason == "finished");
  auto outcome = run.outcome();
  CHECK_FALSE(outcome.error);
  REQUIRE(outcome.attempts.size() == 2);
  REQUIRE(outcome.attempts[0].error);
  CHECK(outcome.attempts[0].error->kind == FailureKind::kLost);
  CHECK_FALSE(outcome.attempts[1].error);
  auto records = results(run.storage());
  REQUIRE(records.size() == 1);
  CHECK(records[0]["attempt"] == 2);
}

TEST_CASE("in-process controller: a node agent joins an elastic group at its next checkpoint") {
  TempDir tmp;
  auto opts = options(2);
  opts.scaling.min_workers = 1;
  opts.run.startup_timeout = 5s;
  // The clock runs fast while the first worker waits out the startup timeout:
  // a heartbeat timeout far beyond it keeps that silent worker alive.
  opts.run.heartbeat_timeout = 600s;
  InprocRun run(tmp.path, opts);
  // One worker of two at the startup timeout: an elastic group starts with it.
  auto first = run.worker("node-a", 101);
  first.hello();
  auto assign = first.main.expect<protocol::Assign>(&run.clock(), 1s);
  CHECK(assign.world_size == 1);
  first.start(assign, /*shares_storage=*/true);

  // An agent comes while the group trains: its worker waits for the next checkpoint.
  Peer agent(run.context(), run.endpoint());
  protocol::AgentHello hello;
  hello.host = "node-b";
  hello.pid = 200;
  hello.workers = {201};
  agent.send(hello);
  agent.expect<protocol::AgentAccepted>();
  CHECK(agent.expect<protocol::Shutdown>().restart);
  agent.send(protocol::Exited{201, 0, 0});  // its worker ended, to wait

  // A checkpoint: copied into the staging directory, committed, and the group regroups.
  protocol::Report report;
  report.iteration = 1;
  report.metrics = encode_metrics({{"step", 1}});
  report.checkpoint = true;
  report.files = {{"model.pt", 5, ""}};
  first.train->send(report);
  auto upload = first.train->expect<protocol::Upload>();
  REQUIRE_FALSE(upload.staging_dir.empty());
  auto file = std::filesystem::path(upload.staging_dir) / "model.pt";
  std::ofstream(file) << "12345";
  first.train->send(protocol::Uploaded{1, {{"model.pt", 5, sha256_file(file)}}, ""});
  CHECK(first.train->expect<protocol::ReportAck>().iteration == 1);
  CHECK(first.main.expect<protocol::Shutdown>().restart);
  CHECK(agent.expect<protocol::Shutdown>().restart);

  // The next attempt: the agent starts its worker, and both resume from the checkpoint.
  CHECK(agent.expect<protocol::Restart>().attempt == 2);
  REQUIRE(run.wait_for_log("attempt 2 starts from checkpoint_"));
  // A worker started by hand connects first (a restart waits only for the
  // workers agents announce), then the agent's.
  auto again = run.worker("node-a", 103);
  again.hello();
  REQUIRE(run.wait_for_log("a worker on node-a (pid 103) connected"));
  hello.workers = {202};
  hello.attempt = 2;
  agent.send(hello);
  REQUIRE(run.wait_for_log("the node agent on node-b (pid 200) started 1 workers"));
  auto joined = run.worker("node-b", 202);
  joined.hello(2, /*agent_pid=*/200);
  auto assign_again = again.main.expect<protocol::Assign>();
  auto assign_joined = joined.main.expect<protocol::Assign>();
  CHECK(assign_again.world_size == 2);
  CHECK(assign_joined.world_size == 2);
  CHECK(std::filesystem::path(assign_joined.checkpoint_dir).filename() ==
        checkpoints(run.storage()).at(0));
  again.start(assign_again);
  joined.start(assign_joined);
  again.report(1);
  joined.report(1);
  CHECK(again.train->expect<protocol::ReportAck>().iteration == 1);  // as the ranks count
  again.train->send(protocol::Done{1});
  joined.train->send(protocol::Done{1});
  agent.send(protocol::Exited{202, 0, 0});
  auto outcome = run.outcome();
  CHECK_FALSE(outcome.error);
  REQUIRE(outcome.attempts.size() == 2);
  CHECK(outcome.attempts[0].regrouped);
  CHECK(outcome.attempts[0].world_size == 1);
  CHECK(outcome.attempts[1].world_size == 2);
  CHECK(outcome.attempts[1].resumed_from == checkpoints(run.storage()).at(0));
  auto records = results(run.storage());
  REQUIRE(records.size() == 2);
  CHECK(records[1]["iteration"] == 2);  // the run's count goes on
  CHECK(records[1]["attempt"] == 2);
}

TEST_CASE(
    "in-process controller: an asynchronous checkpoint owed at a failure is never committed") {
  TempDir tmp;
  InprocRun run(tmp.path, options(1));
  auto first = run.worker("node-a", 101);
  auto assign = join(first);
  first.attach_upload(assign);
  // Report 1 with an asynchronous checkpoint: the report is recorded at once,
  // the upload goes to the upload connection and is still owed.
  protocol::Report report;
  report.iteration = 1;
  report.metrics = encode_metrics({{"step", 1}});
  report.checkpoint = true;
  report.async = true;
  report.files = {{"model.pt", 5, ""}};
  first.train->send(report);
  auto upload = first.upload->expect<protocol::Upload>();
  CHECK(first.train->expect<protocol::ReportAck>().iteration == 1);
  // Report 2's checkpoint waits, unanswered, for report 1's commit.
  report.iteration = 2;
  first.train->send(report);
  CHECK_FALSE(first.train->has_message(5ms));
  // The rank raises; its upload finishes after the failure.
  first.train->send(protocol::Failed{"boom", "exception"});
  REQUIRE(run.wait_for_log("raised: boom"));
  if (upload.staging_dir.empty()) {
    zmq::message_t bytes(std::string("12345"));
    std::vector<zmq::message_t> blobs;
    blobs.push_back(std::move(bytes));
    first.upload->send(protocol::UploadChunk{0, 0}, std::move(blobs));
  }
  first.upload->send(protocol::Uploaded{1, {{"model.pt", 5, std::string(64, 'a')}}, ""});
  CHECK(first.main.expect<protocol::Shutdown>(&run.clock(), 100ms).restart);

  // The next attempt starts from nothing: the checkpoint was never committed.
  REQUIRE(run.wait_for_log("attempt 2 starts from the start"));
  auto second = run.worker("node-a", 102);
  auto again = join(second);
  CHECK(again.checkpoint_dir.empty());
  finish(second);
  auto outcome = run.outcome();
  CHECK_FALSE(outcome.error);
  REQUIRE(outcome.attempts.size() == 2);
  REQUIRE(outcome.attempts[0].error);
  CHECK(outcome.attempts[0].error->message == "raised: boom");
  CHECK(checkpoints(run.storage()).empty());
  // Two reports and no line of a commit.
  CHECK(results(run.storage()).size() == 2);
}

TEST_CASE("in-process controller: a stop during the back-off ends the run at once") {
  TempDir tmp;
  auto opts = options(1);
  opts.failure.max_failures = -1;
  InprocRun run(tmp.path, opts);
  // Two attempts that fail before any report: a back-off before the third.
  for (int64_t pid : {101, 102}) {
    if (pid == 102) REQUIRE(run.wait_for_log("attempt 2 starts"));
    auto worker = run.worker("node-a", pid);
    join(worker);
    worker.train->send(protocol::Failed{"boom", "exception"});
    CHECK(worker.main.expect<protocol::Shutdown>(&run.clock(), 100ms).restart);
  }
  REQUIRE(run.wait_for_log("waiting 0.5 s before attempt 3"));
  // The clock stands still: only the stop can end the wait.
  run.stop();
  auto outcome = run.outcome();
  REQUIRE(outcome.error);
  CHECK(outcome.error->kind == FailureKind::kInterrupted);
  CHECK(outcome.attempts.size() == 2);
  CHECK_FALSE(run.logged("attempt 3 starts"));
}

namespace {

// Recovery in place, and no rank lost by a heartbeat while the clock runs.
TrainerOptions in_place_options(int workers) {
  auto opts = options(workers);
  opts.failure.in_place = true;
  opts.run.heartbeat_timeout = 600s;
  return opts;
}

// Three workers of a node agent, started and in the group: by world rank.
struct AgentGroup {
  AgentGroup(InprocRun& run) : agent(run.context(), run.endpoint()) {
    protocol::AgentHello hello;
    hello.host = "node-a";
    hello.pid = 200;
    hello.workers = {201, 202, 203};
    agent.send(hello);
    agent.expect<protocol::AgentAccepted>();
    workers.reserve(3);
    for (int64_t pid : {201, 202, 203}) workers.push_back(run.worker("node-a", pid));
    for (auto& worker : workers) worker.hello(0, /*agent_pid=*/200);
    for (auto& worker : workers) {
      auto assign = worker.main.expect<protocol::Assign>();
      worker.start(assign, /*shares_storage=*/true);
      by_rank[assign.world_rank] = &worker;
    }
    // Every one has started training (its STARTED read).
    for (int64_t pid : {201, 202, 203}) {
      REQUIRE(run.wait_for_log("(node-a, pid " + std::to_string(pid) + ") shares the run"));
    }
  }
  Peer agent;
  std::vector<ScriptedWorker> workers;
  std::map<int, ScriptedWorker*> by_rank;
};

// Report `iteration` on each of `ranks` with a checkpoint: a file of its own
// from each of `writers`, an empty directory from the others; waits for the
// report's acknowledgement.
void report_checkpoint(AgentGroup& group, int64_t iteration, const std::vector<int>& ranks,
                       const std::vector<int>& writers) {
  for (int rank : ranks) {
    protocol::Report report;
    report.iteration = iteration;
    report.metrics = encode_metrics({{"step", iteration}});
    const bool writes = std::find(writers.begin(), writers.end(), rank) != writers.end();
    const auto name = "shard-" + std::to_string(rank) + ".pt";
    report.checkpoint = true;  // an empty directory from those that do not write
    if (writes) report.files = {{name, 5, ""}};
    auto& train = *group.by_rank.at(rank)->train;
    train.send(report);
    auto upload = train.expect<protocol::Upload>();
    if (!writes) {
      train.send(protocol::Uploaded{iteration, {}, ""});
      continue;
    }
    REQUIRE_FALSE(upload.staging_dir.empty());
    auto file = std::filesystem::path(upload.staging_dir) / name;
    std::ofstream(file) << "12345";
    train.send(protocol::Uploaded{iteration, {{name, 5, sha256_file(file)}}, ""});
  }
  for (int rank : ranks) {
    CHECK(group.by_rank.at(rank)->train->expect<protocol::ReportAck>().iteration == iteration);
  }
}

}  // namespace

TEST_CASE(
    "in-process controller: no checkpoint is kept that lacks the files of a lost rank that "
    "writes them") {
  // Every rank writes a shard (train::Trainer's rank-<r>.pt), or rank 0
  // alone, and the loss comes after a checkpoint of the whole group or before
  // any (then the ranks that report the next one show the pattern).
  for (const bool shards : {true, false}) {
    for (const bool known : {true, false}) {
      CAPTURE(shards);
      CAPTURE(known);
      TempDir tmp;
      InprocRun run(tmp.path, in_place_options(3));
      AgentGroup group(run);
      // Every rank reports; those that do not write pass an empty directory.
      const auto writers = [&](std::vector<int> ranks) {
        return shards ? ranks : std::vector<int>{0};
      };
      if (known) report_checkpoint(group, 1, {0, 1, 2}, writers({0, 1, 2}));
      // Rank 2 dies; its agent says so. A node agent's worker gets no replacement.
      group.agent.send(protocol::Exited{group.by_rank[2]->pid, 0, SIGKILL});
      if (shards && known) {
        // Without its shard no checkpoint would be whole: the group restarts.
        CHECK(run.wait_for_log(
            "no recovery in place (it was rank 2, which writes into the checkpoints (it wrote "
            "into the last one), and no replacement can take its place: its worker was not "
            "started by the controller (a node agent's or a remote one)), the group restarts"));
        CHECK(group.agent.expect<protocol::Shutdown>(&run.clock(), 100ms).restart);
        CHECK(checkpoints(run.storage()).size() == 1);
        continue;
      }
      REQUIRE(run.wait_for_log("the other 2 go on in place"));
      for (int rank : {0, 1}) group.by_rank[rank]->main.expect<protocol::PeerLost>();
      const int64_t iteration = known ? 2 : 1;
      const auto before = checkpoints(run.storage()).size();
      if (!shards) {  // it lacks nothing, and is kept
        report_checkpoint(group, iteration, {0, 1}, writers({0, 1}));
        CHECK_FALSE(run.logged("is not kept"));
        CHECK(checkpoints(run.storage()).size() == before + 1);
        for (int rank : {0, 1}) group.by_rank[rank]->train->send(protocol::Done{iteration});
        CHECK_FALSE(run.outcome(100ms).error);
        continue;
      }
      // Rank 1's shard shows that rank 2 writes one too: not kept, and as no
      // replacement comes for rank 2, the group restarts from the latest.
      for (int rank : {0, 1}) {
        protocol::Report report;
        report.iteration = iteration;
        report.metrics = encode_metrics({{"step", iteration}});
        report.checkpoint = true;
        const auto name = "shard-" + std::to_string(rank) + ".pt";
        report.files = {{name, 5, ""}};
        auto& train = *group.by_rank.at(rank)->train;
        train.send(report);
        auto upload = train.expect<protocol::Upload>();
        auto file = std::filesystem::path(upload.staging_dir) / name;
        std::ofstream(file) << "12345";
        train.send(protocol::Uploaded{iteration, {{name, 5, sha256_file(file)}}, ""});
      }
      CHECK(run.wait_for_log(
          "the checkpoint of report 1 is not kept: it lacks the files of rank 2, lost and not "
          "replaced yet, which, as the other ranks' files show, writes a shard too (the latest "
          "is none)"));
      CHECK(run.wait_for_log(
          "rank 2's replacement could not come: no checkpoint is whole without the files it "
          "writes, so the group restarts from the latest"));
      CHECK(group.agent.expect<protocol::Shutdown>(&run.clock(), 100ms).restart);
      CHECK(checkpoints(run.storage()).size() == before);
    }
  }
}

TEST_CASE(
    "in-process controller: a vote that arrives with a node agent's word of a lost rank does "
    "not apply the step") {
  // The two arrive together, in an order the socket's fair queue picks; the
  // one a quorum miscounts, the agent's word first, comes in some rounds.
  for (int round = 0; round < 5; ++round) {
    CAPTURE(round);
    TempDir tmp;
    InprocRun run(tmp.path, in_place_options(3));
    AgentGroup group(run);
    auto& by_rank = group.by_rank;
    // Rank 2 completes step 1's collectives and votes, then dies. Its agent's
    // word and rank 0's vote arrive together, before rank 1's: rank 1's
    // collective never completed, so no rank may apply the step.
    by_rank[2]->train->send(protocol::StepVote{1, 0});
    run.clock().hold();
    group.agent.send(protocol::Exited{by_rank[2]->pid, 0, SIGKILL});
    by_rank[0]->train->send(protocol::StepVote{1, 0});
    run.clock().release();
    REQUIRE(run.wait_for_log("the other 2 go on in place at step 1"));
    for (int rank : {0, 1}) {
      CAPTURE(rank);
      auto lost = by_rank[rank]->main.expect<protocol::PeerLost>();
      CHECK(lost.generation == 1);
      CHECK(lost.ranks == std::vector<int32_t>{0, 1});
      CHECK(lost.lost == std::vector<int32_t>{2});
    }
    // Rank 0 voted in the group that ended: told to do the step again.
    auto decision = by_rank[0]->train->expect<protocol::StepDecision>();
    CHECK(decision.step == 1);
    CHECK_FALSE(decision.apply);
    // In the survivors' group, both vote again, and the step is applied.
    for (int rank : {0, 1}) by_rank[rank]->train->send(protocol::StepVote{1, 1});
    for (int rank : {0, 1}) {
      CAPTURE(rank);
      auto again = by_rank[rank]->train->expect<protocol::StepDecision>();
      CHECK(again.step == 1);
      CHECK(again.apply);
    }
    run.stop();
  }
}
