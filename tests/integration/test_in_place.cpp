// Recovery in place (--recovery in-place): a rank killed with SIGKILL in the
// middle of a step, its peers inside the step's collectives, and the others go
// on without it in a new group: no restart, no step thrown away, replicas
// identical to the bit. Real worker processes, real kills, real Gloo.

#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "run_helpers.h"

namespace {

const std::string kSurvivors = std::string("--plugin '") + DDP_PLUGIN +
                               "' --entry survivors -n 3 --name s --recovery in-place"
                               // small buckets: some are in flight when a rank dies
                               " --config bucket_cap_mb=0.0005 --config first_bucket_cap_mb=0.0005";

// <out>/rank<r>.txt: the steps rank r applied, then its parameters, one a line.
std::vector<std::string> rank_file(const std::filesystem::path& out, int rank) {
  std::ifstream in(out / ("rank" + std::to_string(rank) + ".txt"));
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// Runs the `survivors` entry with `args`, writing into <sandbox>/out.
RunOutput run_survivors(const Sandbox& box, const std::string& args) {
  auto out = box.root() / "out";
  std::filesystem::create_directories(out);
  return box.run(kSurvivors + " " + args + " --config out=" + out.string());
}

}  // namespace

TEST_CASE("a rank killed mid-step: the others go on in place, every step applied, replicas equal") {
  Sandbox box;
  auto out = box.root() / "out";
  auto run = run_survivors(box,
                           "--max-failures 1 --config steps=30 --config kill_rank=1"
                           " --config kill_step=12");
  INFO(run.output);
  REQUIRE(run.exit_code == 0);
  // Synchronised steps, counted from 1: 12 backward passes and the replica
  // checks of 2 reports before the 13th backward pass.
  CHECK(run.output.find("was killed by SIGKILL (Killed): the other 2 go on in place at step 15") !=
        std::string::npos);
  CHECK(run.output.find("attempt 2") == std::string::npos);  // no restart
  // A loop of its own, not over loader.epochs(), gets no replacement: the SDK
  // cannot start it part-way.
  CHECK(run.output.find("no replacement for rank 1 (rank 0's train function does not take one at "
                        "its step boundaries (train::Trainer's and a loop over loader.epochs() "
                        "with a known optimizer do)): the group goes on with 2 "
                        "ranks") != std::string::npos);
  // Every survivor applied all 30 steps, as an undisturbed run does, and
  // ends with the same parameters to the last bit.
  auto rank0 = rank_file(out, 0);
  auto rank2 = rank_file(out, 2);
  REQUIRE(rank0.size() > 1);
  CHECK(rank0.front() == "30");
  CHECK(rank0 == rank2);
  CHECK_FALSE(std::filesystem::exists(out / "rank1.txt"));
  auto dir = box.run_dir("s");
  auto reports = read_reports(dir / "result.jsonl");
  REQUIRE(reports.size() == 6);
  for (size_t i = 0; i < reports.size(); ++i) {
    CHECK(reports[i]["attempt"] == 1);
    CHECK(reports[i]["metrics"]["step"] == static_cast<int>(5 * i + 4));
    CHECK(reports[i]["metrics"]["applied"] == static_cast<int>(5 * i + 5));
  }
  auto info = read_json(dir / "run.json");
  CHECK(info["status"] == "finished");
  REQUIRE(info["attempts"].size() == 1);
  const auto& recoveries = info["attempts"][0]["recoveries"];
  REQUIRE(recoveries.size() == 1);
  CHECK(recoveries[0]["rank"] == 1);
  CHECK(recoveries[0]["cause"] == "was killed by SIGKILL (Killed)");
  CHECK(recoveries[0]["world_size"] == 2);
  CHECK(recoveries[0]["step"] == 15);
  CHECK(recoveries[0]["steps_lost"] == 0);
  CHECK(recoveries[0]["seconds"].get<double>() >= 0);
  auto described = box.run("results '" + dir.string() + "'");
  CHECK(described.output.find("recovered:    rank 1 was killed by SIGKILL (Killed) at step 15; 2 "
                              "went on in place (attempt 1), steps lost 0") != std::string::npos);
  auto page = read_text(dir / "report.html");
  CHECK(page.find("<h2>Recovered in place</h2>") != std::string::npos);
  CHECK_FALSE(box.any_worker_alive());
}

TEST_CASE("a rank killed mid-step with a GradScaler: its agreement on inf goes on in place too") {
  Sandbox box;
  auto out = box.root() / "out";
  auto run = run_survivors(box,
                           "--max-failures 1 --config steps=30 --config kill_rank=1"
                           " --config kill_step=12 --config scaler=true");
  INFO(run.output);
  REQUIRE(run.exit_code == 0);
  CHECK(run.output.find("was killed by SIGKILL (Killed): the other 2 go on in place at step ") !=
        std::string::npos);
  CHECK(run.output.find("attempt 2") == std::string::npos);  // no restart
  auto rank0 = rank_file(out, 0);
  REQUIRE(rank0.size() > 1);
  CHECK(rank0.front() == "30");
  CHECK(rank0 == rank_file(out, 2));
  auto info = read_json(box.run_dir("s") / "run.json");
  REQUIRE(info["attempts"].size() == 1);
  REQUIRE(info["attempts"][0]["recoveries"].size() == 1);
  CHECK(info["attempts"][0]["recoveries"][0]["steps_lost"] == 0);
}

TEST_CASE("two ranks killed one after the other: the last one finishes alone") {
  Sandbox box;
  auto out = box.root() / "out";
  auto run = run_survivors(box,
                           "--max-failures 2 --config steps=30 --config kill_rank=1"
                           " --config kill_step=8 --config kill_rank2=2 --config kill_step2=20");
  INFO(run.output);
  REQUIRE(run.exit_code == 0);
  // Synchronised steps: 20 backward passes and 4 reports' replica checks.
  CHECK(run.output.find("the last rank goes on in place at step 25") != std::string::npos);
  auto rank0 = rank_file(out, 0);
  REQUIRE(rank0.size() > 1);
  CHECK(rank0.front() == "30");
  auto dir = box.run_dir("s");
  auto info = read_json(dir / "run.json");
  REQUIRE(info["attempts"].size() == 1);
  const auto& recoveries = info["attempts"][0]["recoveries"];
  REQUIRE(recoveries.size() == 2);
  CHECK(recoveries[0]["rank"] == 1);
  CHECK(recoveries[0]["steps_lost"] == 0);
  CHECK(recoveries[1]["rank"] == 2);
  CHECK(recoveries[1]["world_size"] == 1);
  CHECK(recoveries[1]["steps_lost"] == 0);
  auto reports = read_reports(dir / "result.jsonl");
  REQUIRE(reports.size() == 6);
  CHECK(reports.back()["metrics"]["applied"] == 30);
}

TEST_CASE("rank 0 killed with no replacement to take its place restarts the group") {
  // A train function saves its checkpoint on rank 0: a group without it for
  // good would save none.
  Sandbox box;
  auto run = run_survivors(box,
                           "--max-failures 1 --config steps=20 --config kill_rank=0"
                           " --config kill_step=8 --config marker=" +
                               (box.root() / "killed").string());
  INFO(run.output);
  REQUIRE(run.exit_code == 0);
  CHECK(run.output.find("no recovery in place (it was rank 0, which saves the checkpoints, and no "
                        "replacement can take its place: rank 0's train function does not take "
                        "one at its step boundaries") != std::string::npos);
  auto info = read_json(box.run_dir("s") / "run.json");
  CHECK(info["attempts"].size() == 2);
}

TEST_CASE(
    "a Trainer run whose rank 0 is killed goes on in place, and rank 0's replacement "
    "catches up from rank 1") {
  Sandbox box;
  auto marker = (box.root() / "failed-once").string();
  auto run = box.run(std::string("--plugin '") + TRAINER_PLUGIN +
                     "' -n 3 --name z --recovery in-place --max-failures 1 --config epochs=4" +
                     " --config batches=8 --config fail_step=10 --config fail_rank=0" +
                     " --config await_replacement=true --config step_sleep_ms=20" +
                     " --config marker=" + marker);
  INFO(run.output);
  REQUIRE(run.exit_code == 0);
  CHECK(run.output.find("the other 2 go on in place") != std::string::npos);
  CHECK(run.output.find("train::Trainer: rank 0 caught up from rank 1 at epoch ") !=
        std::string::npos);
  auto dir = box.run_dir("z");
  auto reports = read_reports(dir / "result.jsonl");
  REQUIRE(reports.size() == 4);
  CHECK(reports.back()["metrics"]["step"] == 32);
  // The last checkpoint is whole: the group's first rank (rank 1 since the
  // loss) wrote the model and the Trainer's state, the replacement its own.
  const auto last = dir / reports.back()["checkpoint"].get<std::string>();
  CHECK(std::filesystem::exists(last / "model.pt"));
  CHECK(std::filesystem::exists(last / "trainer.pt"));
  CHECK(std::filesystem::exists(last / "rank-0.pt"));
  auto info = read_json(dir / "run.json");
  REQUIRE(info["attempts"].size() == 1);
  REQUIRE(info["attempts"][0]["recoveries"].size() == 1);
  CHECK(info["attempts"][0]["recoveries"][0]["rank"] == 0);
  CHECK(info["attempts"][0]["recoveries"][0]["replacement_pid"].get<int64_t>() > 0);
}

TEST_CASE("rank 0's replacement that raises before it joins restarts the group") {
  Sandbox box;
  auto marker = (box.root() / "failed-once").string();
  auto run = box.run(std::string("--plugin '") + TRAINER_PLUGIN +
                     "' -n 3 --name y --recovery in-place --max-failures 1 --config epochs=2" +
                     " --config batches=8 --config fail_step=4 --config fail_rank=0" +
                     " --config await_replacement=true --config replacement_raises=true" +
                     " --config step_sleep_ms=50 --config marker=" + marker);
  INFO(run.output);
  // One failure (the kill), survived by the restart it falls back to.
  REQUIRE(run.exit_code == 0);
  CHECK(run.output.find("the other 2 go on in place") != std::string::npos);
  CHECK(run.output.find("rank 0's replacement raised in") != std::string::npos);
  CHECK(run.output.find("no other rank saves the checkpoints, so the group restarts from the "
                        "latest") != std::string::npos);
  auto dir = box.run_dir("y");
  auto info = read_json(dir / "run.json");
  REQUIRE(info["attempts"].size() == 2);
  REQUIRE(info["attempts"][0]["recoveries"].size() == 1);
  CHECK(info["attempts"][0]["error"]["rank"] == 0);
  auto reports = read_reports(dir / "result.jsonl");
  REQUIRE_FALSE(reports.empty());
  CHECK(reports.back()["metrics"]["step"] == 16);
}

TEST_CASE("a kill with no failures left to survive ends the run as before") {
  Sandbox box;
  auto run = run_survivors(box,
                           "--max-failures 1 --config steps=30 --config kill_rank=1"
                           " --config kill_step=5 --config kill_rank2=2 --config kill_step2=15");
  INFO(run.output);
  CHECK(run.exit_code == 1);
  CHECK(run.output.find("no recovery in place (no failures left to survive)") != std::string::npos);
  auto info = read_json(box.run_dir("s") / "run.json");
  CHECK(info["status"] == "failed");
  CHECK(info["attempts"][0]["recoveries"].size() == 1);
  // error.json names the failure that ended it, and the one survived before.
  auto error = read_json(box.run_dir("s") / "error.json");
  CHECK(error["rank"] == 2);
  REQUIRE(error["recoveries"].size() == 1);
  CHECK(error["recoveries"][0]["rank"] == 1);
  CHECK(error["recoveries"][0]["attempt"] == 1);
  CHECK_FALSE(box.any_worker_alive());
}

TEST_CASE(
    "a collective that fails with no rank lost raises within a heartbeat timeout, saying so") {
  Sandbox box;
  auto run = run_survivors(box,
                           "--max-failures 1 --collective-timeout 1 --heartbeat-timeout 2"
                           " --config steps=10 --config stall_rank=1 --config stall_step=3"
                           " --config stall_ms=4000");
  INFO(run.output);
  CHECK(run.exit_code == 1);  // it stalls again in the second attempt
  // (Within the heartbeat timeout or the collective timeout, whichever is shorter.)
  CHECK(run.output.find("a collective failed, and the controller announced no lost rank within "
                        "1 s: the failure is not a lost rank's") != std::string::npos);
  CHECK(run.output.find("go on in place") == std::string::npos);
  CHECK_FALSE(box.any_worker_alive());
}

TEST_CASE("--recovery in-place needs --max-failures, and the CPU") {
  Sandbox box;
  auto run = box.run(kSurvivors + " --config out=/nonexistent");
  CHECK(run.exit_code == 2);
  CHECK(run.output.find("recovery in place needs failures to survive") != std::string::npos);
  run = box.run(kSurvivors + " --max-failures 1 --use-gpu --config out=/nonexistent");
  CHECK(run.exit_code == 2);
  // (A trainrun built with a CPU-only LibTorch refuses --use-gpu first.)
  CHECK((run.output.find("works on the CPU (Gloo) only") != std::string::npos ||
         run.output.find("--use-gpu needs a LibTorch built with CUDA") != std::string::npos));
  run = box.run(kSurvivors + " --recovery sometimes");
  CHECK(run.exit_code == 2);
}

TEST_CASE(
    "a Trainer run whose rank is killed between steps goes on in place, and a replacement "
    "catches up from a peer") {
  Sandbox box;
  auto marker = (box.root() / "failed-once").string();
  auto run = box.run(std::string("--plugin '") + TRAINER_PLUGIN +
                     "' -n 3 --name t --recovery in-place --max-failures 1 --config epochs=3" +
                     " --config batches=8 --config fail_step=10 --config fail_rank=2" +
                     " --config await_replacement=true --config step_sleep_ms=20" +
                     " --config marker=" + marker);
  INFO(run.output);
  REQUIRE(run.exit_code == 0);
  CHECK(run.output.find("the other 2 go on in place") != std::string::npos);
  CHECK(run.output.find("in place of rank 2: it joins the group at a step boundary") !=
        std::string::npos);
  // The Trainer's state came from rank 0 over the group, not from a checkpoint.
  CHECK(run.output.find("train::Trainer: rank 2 caught up from rank 0 at epoch 1") !=
        std::string::npos);
  CHECK(run.output.find("resuming") == std::string::npos);
  auto dir = box.run_dir("t");
  auto reports = read_reports(dir / "result.jsonl");
  REQUIRE(reports.size() == 3);  // an epoch each, as without the kill
  for (const auto& report : reports) CHECK(report["attempt"] == 1);
  CHECK(reports.back()["metrics"]["step"] == 24);  // as many optimizer steps
  // Every report after the join checked the 3 replicas equal to the bit (a
  // report fails otherwise); the replacement wrote its own part of the last
  // checkpoint.
  const auto last = dir / reports.back()["checkpoint"].get<std::string>();
  CHECK(std::filesystem::exists(last / "model.pt"));
  CHECK(std::filesystem::exists(last / "trainer.pt"));
  CHECK(std::filesystem::exists(last / "rank-2.pt"));
  auto info = read_json(dir / "run.json");
  REQUIRE(info["attempts"].size() == 1);
  REQUIRE(info["attempts"][0]["recoveries"].size() == 1);
  const auto& recovery = info["attempts"][0]["recoveries"][0];
  CHECK(recovery["rank"] == 2);
  CHECK(recovery["steps_lost"] == 0);
  CHECK(recovery["replacement_pid"].get<int64_t>() > 0);
  CHECK(recovery["caught_up_seconds"].get<double>() >= recovery["seconds"].get<double>());
  auto results = box.run("results '" + dir.string() + "'");
  CHECK(results.output.find("a replacement (pid ") != std::string::npos);
  // Its output is in a log of its own beside the lost rank's.
  bool replacement_log = false;
  for (const auto& entry : std::filesystem::directory_iterator(dir / "logs")) {
    const auto name = entry.path().filename().string();
    replacement_log = replacement_log || name.rfind("worker-2-", 0) == 0;
  }
  CHECK(replacement_log);
}

TEST_CASE("two ranks lost one after the other are each replaced, and the run ends in one attempt") {
  Sandbox box;
  auto marker = (box.root() / "failed-once").string();
  auto marker2 = (box.root() / "failed-twice").string();
  auto run = box.run(
      std::string("--plugin '") + TRAINER_PLUGIN +
      "' -n 3 --name two --recovery in-place --max-failures 2 --config epochs=3" +
      " --config batches=8 --config fail_step=5 --config fail_rank=2" +
      " --config fail_step2=15 --config fail_rank2=1 --config await_replacement=true" +
      " --config step_sleep_ms=20 --config marker=" + marker + " --config marker2=" + marker2);
  INFO(run.output);
  REQUIRE(run.exit_code == 0);
  CHECK(run.output.find("rank 2 caught up from rank 0") != std::string::npos);
  CHECK(run.output.find("rank 1 caught up from rank 0") != std::string::npos);
  auto dir = box.run_dir("two");
  auto info = read_json(dir / "run.json");
  REQUIRE(info["attempts"].size() == 1);
  const auto& recoveries = info["attempts"][0]["recoveries"];
  REQUIRE(recoveries.size() == 2);
  CHECK(recoveries[0]["rank"] == 2);
  CHECK(recoveries[1]["rank"] == 1);
  CHECK(recoveries[1]["world_size"] == 2);  // the first replacement had joined
  for (const auto& recovery : recoveries) {
    CHECK(recovery["steps_lost"] == 0);
    CHECK(recovery["replacement_pid"].get<int64_t>() > 0);
  }
  auto reports = read_reports(dir / "result.jsonl");
  REQUIRE(reports.size() == 3);
  CHECK(reports.back()["metrics"]["step"] == 24);
  const auto last = dir / reports.back()["checkpoint"].get<std::string>();
  CHECK(std::filesystem::exists(last / "rank-1.pt"));
  CHECK(std::filesystem::exists(last / "rank-2.pt"));
}

TEST_CASE(
    "a replacement that raises before it joins is dropped, and the group goes on until a "
    "checkpoint would lack the lost rank's shard") {
  Sandbox box;
  auto marker = (box.root() / "failed-once").string();
  auto run = box.run(std::string("--plugin '") + TRAINER_PLUGIN +
                     "' -n 3 --name d --recovery in-place --max-failures 1 --config epochs=2" +
                     " --config batches=8 --config fail_step=4 --config fail_rank=2" +
                     " --config await_replacement=true --config replacement_raises=true" +
                     " --config step_sleep_ms=50 --config marker=" + marker);
  INFO(run.output);
  REQUIRE(run.exit_code == 0);
  CHECK(run.output.find("rank 2's replacement raised in") != std::string::npos);
  CHECK(
      run.output.find("the replacement cannot build its module: the group goes on with 2 ranks") !=
      std::string::npos);
  // The Trainer writes rank-<r>.pt on every rank: the epoch's checkpoint
  // would lack rank 2's, and no replacement comes, so the group restarts.
  CHECK(run.output.find("the checkpoint of report 1 is not kept: it lacks the files of rank 2, "
                        "lost and not replaced yet, which, as the other ranks' files show, writes "
                        "a shard too") != std::string::npos);
  CHECK(run.output.find("rank 2's replacement could not come: no checkpoint is whole without the "
                        "files it writes, so the group restarts from the latest") !=
        std::string::npos);
  auto dir = box.run_dir("d");
  auto info = read_json(dir / "run.json");
  REQUIRE(info["attempts"].size() == 2);
  REQUIRE(info["attempts"][0]["recoveries"].size() == 1);
  CHECK_FALSE(info["attempts"][0]["recoveries"][0].contains("replacement_pid"));
  auto reports = read_reports(dir / "result.jsonl");
  REQUIRE_FALSE(reports.empty());
  CHECK(reports.back()["metrics"]["step"] == 16);
  CHECK(reports.back()["attempt"] == 2);
}

TEST_CASE(
    "a replacement killed as it catches up restarts the group from the checkpoint, and the run "
    "ends with as many steps") {
  Sandbox box;
  auto marker = (box.root() / "failed-once").string();
  auto catch_up = (box.root() / "failed-catching-up").string();
  auto run = box.run(std::string("--plugin '") + TRAINER_PLUGIN +
                     "' -n 3 --name c --recovery in-place --max-failures 2 --config epochs=2" +
                     " --config batches=8 --config fail_step=4 --config fail_rank=1" +
                     " --config kill_in_backward=true --config await_replacement=true" +
                     " --config step_sleep_ms=20 --config marker=" + marker +
                     " --config catch_up_marker=" + catch_up);
  INFO(run.output);
  REQUIRE(run.exit_code == 0);
  CHECK(std::filesystem::exists(catch_up));
  CHECK(run.output.find("failing in the backward pass of step 5") != std::string::npos);
  CHECK(run.output.find("failing while catching up") != std::string::npos);
  auto dir = box.run_dir("c");
  auto info = read_json(dir / "run.json");
  REQUIRE(info["attempts"].size() == 2);
  REQUIRE(info["attempts"][0]["recoveries"].size() == 1);
  CHECK(info["attempts"][0]["recoveries"][0]["rank"] == 1);
  CHECK(info["attempts"][0]["recoveries"][0]["steps_lost"] == 0);
  CHECK_FALSE(info["attempts"][0]["recoveries"][0].contains("replacement_pid"));
  auto reports = read_reports(dir / "result.jsonl");
  REQUIRE(reports.size() == 2);
  CHECK(reports.back()["metrics"]["step"] == 16);
}

TEST_CASE("a train function that takes the process group itself restarts the group, and says why") {
  Sandbox box;
  auto marker = (box.root() / "failed-once").string();
  auto run = box.run(std::string("--plugin '") + TEST_PLUGIN +
                     "' --entry resumable -n 2 --name r --recovery in-place --max-failures 1" +
                     " --config steps=6 --config fail_step=3 --config marker=" + marker);
  INFO(run.output);
  REQUIRE(run.exit_code == 0);
  // Unless the survivor's collective failed first (then the attempt was
  // failing already), the refusal names the reason.
  const bool named = run.output.find(
                         "'s train function took train::process_group() itself, and "
                         "its own collectives cannot be done again in a new group), "
                         "the group restarts") != std::string::npos;
  const bool failing_first =
      run.output.find(
          "no recovery in place (the attempt was already failing), the group "
          "restarts") != std::string::npos;
  CHECK((named || failing_first));
  CHECK(run.output.find("attempt 2/2 after rank 1") != std::string::npos);
  auto info = read_json(box.run_dir("r") / "run.json");
  REQUIRE(info["attempts"].size() == 2);
  CHECK_FALSE(info["attempts"][0].contains("recoveries"));
}

TEST_CASE(
    "a rank killed while its asynchronous checkpoint uploads restarts the group from the last "
    "one committed") {
  Sandbox box;
  auto out = box.root() / "out";
  auto run = run_survivors(box,
                           "--max-failures 1 --config steps=30 --config kill_rank=1"
                           " --config kill_step=14 --config checkpoint_every=5"
                           " --config upload_mode=async --config checkpoint_kb=100000"
                           " --config marker=" +
                               (box.root() / "killed").string());
  INFO(run.output);
  REQUIRE(run.exit_code == 0);
  CHECK(run.output.find("no recovery in place (a checkpoint was uploading), the group restarts") !=
        std::string::npos);
  auto info = read_json(box.run_dir("s") / "run.json");
  REQUIRE(info["attempts"].size() == 2);
  CHECK(info["attempts"][1]["resumed_from"] == "checkpoint_000001");  // step 10's; 15's never was
  // The restarted group ends as one: every rank the same parameters.
  auto rank0 = rank_file(out, 0);
  REQUIRE(rank0.size() > 1);
  CHECK(rank0 == rank_file(out, 1));
  CHECK(rank0 == rank_file(out, 2));
}

namespace {

// Runs the `epochs_loop` entry on 3 workers, rank 1 killed in the backward of
// its 12th step, with `args`, writing into <sandbox>/out.
RunOutput run_epochs_loop(const Sandbox& box, const std::string& args) {
  auto out = box.root() / "out";
  std::filesystem::create_directories(out);
  return box.run(std::string("--plugin '") + DDP_PLUGIN +
                 "' --entry epochs_loop -n 3 --name e --recovery in-place --max-failures 1" +
                 " --config kill_rank=1 --config kill_step=12 --config marker=" +
                 (box.root() / "killed").string() + " --config out=" + out.string() + " " + args);
}

// Every rank's parameters (rank_file's lines after the first two).
std::vector<std::string> parameters_of(const std::vector<std::string>& lines) {
  return lines.size() > 2 ? std::vector<std::string>(lines.begin() + 2, lines.end())
                          : std::vector<std::string>{};
}

}  // namespace

TEST_CASE(
    "a loop of its own over loader.epochs() takes a replacement, which starts at the survivors' "
    "batch with their optimizer's state") {
  // train::optim's optimizers are known from construction; torch::optim's
  // once registered (and they update p.data(), whose version is not the
  // parameter's: the boundary is found from the values).
  for (const std::string optimizer : {"train", "registered"}) {
    CAPTURE(optimizer);
    Sandbox box;
    auto out = box.root() / "out";
    auto run = run_epochs_loop(box, "--config optimizer=" + optimizer);
    INFO(run.output);
    REQUIRE(run.exit_code == 0);
    CHECK(run.output.find("the other 2 go on in place") != std::string::npos);
    CHECK(run.output.find("train: rank 1 caught up from rank 0 at epoch 1, batch ") !=
          std::string::npos);
    CHECK(run.output.find("rank 1's replacement caught up: 3 ranks applied step") !=
          std::string::npos);
    // 3 epochs of 10 batches: the survivors applied all 30 steps, as an
    // undisturbed run does; the replacement the ones after its first batch;
    // and the 3 end with the same parameters to the last bit (each report
    // after the join checked that too).
    auto rank0 = rank_file(out, 0);
    auto rank1 = rank_file(out, 1);
    REQUIRE(rank0.size() > 2);
    REQUIRE(rank1.size() > 2);
    CHECK(rank0[0] == "30");
    CHECK(rank_file(out, 2) == rank0);
    CHECK(std::stoi(rank1[1]) >= 12);
    CHECK(std::stoi(rank1[0]) + std::stoi(rank1[1]) == 30);
    CHECK(parameters_of(rank1) == parameters_of(rank0));
    auto dir = box.run_dir("e");
    auto reports = read_reports(dir / "result.jsonl");
    REQUIRE(reports.size() == 3);
    CHECK(reports.back()["metrics"]["applied"] == 30);
    auto info = read_json(dir / "run.json");
    REQUIRE(info["attempts"].size() == 1);
    REQUIRE(info["attempts"][0]["recoveries"].size() == 1);
    CHECK(info["attempts"][0]["recoveries"][0]["replacement_pid"].get<int64_t>() > 0);
    CHECK(info["attempts"][0]["recoveries"][0]["steps_lost"] == 0);
  }
}

TEST_CASE("a replacement that joins after an epoch's last batch starts with that epoch's report") {
  // One batch an epoch: every boundary is an epoch's last, and the
  // replacement's first collective is the epoch's report, not a backward.
  Sandbox box;
  auto out = box.root() / "out";
  auto run = run_epochs_loop(box, "--config batches=1 --config epochs=30");
  INFO(run.output);
  REQUIRE(run.exit_code == 0);
  CHECK(run.output.find(", batch 1\n") !=
        std::string::npos);  // "caught up ... at epoch E, batch 1"
  auto rank0 = rank_file(out, 0);
  auto rank1 = rank_file(out, 1);
  REQUIRE(rank0.size() > 2);
  REQUIRE(rank1.size() > 2);
  CHECK(rank0[0] == "30");
  CHECK(std::stoi(rank1[0]) + std::stoi(rank1[1]) == 30);
  CHECK(parameters_of(rank1) == parameters_of(rank0));
  CHECK(read_reports(box.run_dir("e") / "result.jsonl").size() == 30);
}

TEST_CASE(
    "a loop over loader.epochs() whose optimizer the SDK does not know takes no replacement, and "
    "says why") {
  Sandbox box;
  auto out = box.root() / "out";
  auto run = run_epochs_loop(box, "--config optimizer=unknown --config await_replacement=false");
  INFO(run.output);
  REQUIRE(run.exit_code == 0);
  CHECK(run.output.find("train: this loop over loader.epochs() takes no replacement for a lost "
                        "rank: no optimizer is known to the SDK (a train::optim one, or "
                        "train::register_optimizer)") != std::string::npos);
  CHECK(run.output.find("no replacement for rank 1 (rank 0's train function does not take one") !=
        std::string::npos);
  CHECK(run.output.find("caught up") == std::string::npos);
  auto rank0 = rank_file(out, 0);
  REQUIRE(rank0.size() > 2);
  CHECK(rank0[0] == "30");
  CHECK(rank_file(out, 2) == rank0);
  CHECK_FALSE(std::filesystem::exists(out / "rank1.txt"));
}

TEST_CASE(
    "rank 0 killed in a loop of its own: its replacement catches up from rank 1, and a "
    "checkpoint reported without rank 0 is not kept") {
  // The kill is in the last batch of epoch 0, and the replacement waits for
  // the others' report of that epoch before it joins: that report has no rank
  // 0 to save the model.
  // Synchronous and asynchronous uploads: an asynchronous one is dropped at
  // its commit, and the report that waited for it goes on.
  for (const std::string mode : {"sync", "async"}) {
    CAPTURE(mode);
    Sandbox box;
    auto out = box.root() / "out";
    auto run =
        run_epochs_loop(box,
                        "--config kill_rank=0 --config kill_step=10 --config report_first=true"
                        " --config checkpoint=true --config epochs=4 --config upload_mode=" +
                            mode);
    INFO(run.output);
    REQUIRE(run.exit_code == 0);
    CHECK(run.output.find("the other 2 go on in place") != std::string::npos);
    CHECK(run.output.find("the checkpoint of report 1 is not kept: it lacks the files of rank 0, "
                          "lost and not replaced yet, which saves the checkpoints (the latest is "
                          "none)") != std::string::npos);
    CHECK(run.output.find("train: rank 0 caught up from rank 1 at epoch ") != std::string::npos);
    auto rank0 = rank_file(out, 0);
    auto rank1 = rank_file(out, 1);
    REQUIRE(rank0.size() > 2);
    REQUIRE(rank1.size() > 2);
    CHECK(rank1[0] == "40");
    CHECK(rank_file(out, 2) == rank1);
    CHECK(std::stoi(rank0[0]) + std::stoi(rank0[1]) == 40);
    CHECK(parameters_of(rank0) == parameters_of(rank1));
    auto dir = box.run_dir("e");
    auto reports = read_reports(dir / "result.jsonl");
    REQUIRE(reports.size() == 4);
    CHECK(reports[0].value("checkpoint", "").empty());
    CHECK(reports[0]["metrics"]["applied"] == 10);  // rank 1's, rank 0 being out
    REQUIRE_FALSE(reports.back().value("checkpoint", "").empty());
    // Every checkpoint kept has every rank's files.
    for (size_t i = 1; i < reports.size(); ++i) {
      CAPTURE(i);
      if (reports[i].value("checkpoint", "").empty()) continue;  // made before it joined
      const auto checkpoint = dir / reports[i]["checkpoint"].get<std::string>();
      CHECK(std::filesystem::exists(checkpoint / "model.txt"));
      for (int rank = 0; rank < 3; ++rank) {
        CHECK(std::filesystem::exists(checkpoint / ("rank-" + std::to_string(rank) + ".txt")));
      }
    }
    auto info = read_json(dir / "run.json");
    REQUIRE(info["attempts"].size() == 1);
    REQUIRE(info["attempts"][0]["recoveries"].size() == 1);
    CHECK(info["attempts"][0]["recoveries"][0]["steps_lost"] == 0);
  }
}

TEST_CASE("rank 0's replacement that cannot join before the loop ends restarts the group") {
  // Killed in the last step: the others finish their loop, and its last
  // checkpoint, without rank 0, which would end the run with no checkpoint of
  // its last epoch.
  Sandbox box;
  auto out = box.root() / "out";
  auto run = run_epochs_loop(box,
                             "--config kill_rank=0 --config kill_step=30 --config report_first=true"
                             " --config checkpoint=true");
  INFO(run.output);
  REQUIRE(run.exit_code == 0);
  CHECK(run.output.find("the other 2 go on in place") != std::string::npos);
  CHECK(run.output.find("the checkpoint of report 3 is not kept") != std::string::npos);
  CHECK(run.output.find("rank 0's replacement could not join: the train functions left their "
                        "loop first: no other rank saves the checkpoints, so the group restarts "
                        "from the latest") != std::string::npos);
  auto dir = box.run_dir("e");
  auto info = read_json(dir / "run.json");
  REQUIRE(info["attempts"].size() == 2);
  CHECK(info["attempts"][1]["resumed_from"] == "checkpoint_000001");  // report 2's
  auto reports = read_reports(dir / "result.jsonl");
  REQUIRE_FALSE(reports.empty());
  const auto last = dir / reports.back()["checkpoint"].get<std::string>();
  CHECK(std::filesystem::exists(last / "model.txt"));
  CHECK(rank_file(out, 0) == rank_file(out, 1));
}

TEST_CASE(
    "a rank that raises while rank 0's replacement is on its way fails the attempt for its "
    "exception") {
  // Its loop unwinds (no replacement can join) before its exception is
  // reported: the exception, not rank 0's loss, is the attempt's failure, and
  // both count.
  Sandbox box;
  auto run = run_epochs_loop(box,
                             "--config kill_rank=0 --config kill_step=10 --config report_first=true"
                             " --config raise_rank=2 --config raise_step=12");
  INFO(run.output);
  CHECK(run.exit_code == 1);
  CHECK(run.output.find("the other 2 go on in place") != std::string::npos);
  CHECK(run.output.find("raised at step 12") != std::string::npos);
  CHECK(run.output.find("so the group restarts") == std::string::npos);
  auto error = read_json(box.run_dir("e") / "error.json");
  CHECK(error["rank"] == 2);
  CHECK(error["kind"] == "exception");
}
