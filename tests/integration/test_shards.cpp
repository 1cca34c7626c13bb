// Sharded data in real runs (tests/plugins/shards_plugin.cpp): the model
// counts how many times each sample was trained, so a run's final model says
// whether every sample was trained exactly once per epoch, through a kill -9
// and a restart from a checkpoint, also under another world size.

#include <doctest/doctest.h>

#include <fstream>
#include <regex>

#include "run_helpers.h"

namespace {

constexpr int kSamples = 600;  // 2 and 3 ranks, batches of 10: no padding

std::string pack_samples(const Sandbox& box) { return pack_id_samples(box, kSamples); }

std::string shards_run(const std::string& spec, const std::string& entry, const std::string& name,
                       const std::string& more) {
  return std::string("--plugin '") + SHARDS_PLUGIN + "' --entry " + entry + " --name " + name +
         " --config shards='" + spec + "' --config samples=" + std::to_string(kSamples) + " " +
         more;
}

std::string trained(const std::string& output) { return trained_line(output); }
std::string each_trained(int epochs) { return ::each_trained(epochs, kSamples); }

}  // namespace

TEST_CASE("sharded data: 2 ranks train every sample exactly once per epoch, Trainer and own loop") {
  Sandbox box;
  const auto spec = pack_samples(box);
  for (const char* entry : {"fit", "loop"}) {
    CAPTURE(entry);
    auto run = box.run(shards_run(spec, entry, entry, "-n 2 --config epochs=2"));
    INFO(run.output);
    REQUIRE(run.exit_code == 0);
    CHECK(trained(run.output) == each_trained(2));
  }
}

TEST_CASE("sharded data: a kill -9 mid-epoch and a restart train exactly the samples of a whole run") {
  Sandbox box;
  const auto spec = pack_samples(box);
  for (const char* entry : {"fit", "loop"}) {
    CAPTURE(entry);
    // A checkpoint every 6 steps; rank 1 dies after step 14 of 30 in epoch
    // 0: the group restarts from step 12, the steps after it undone.
    const auto marker = (box.root() / (std::string(entry) + "-failed")).string();
    auto run = box.run(shards_run(spec, entry, std::string("kill-") + entry,
                                  "-n 2 --max-failures 1 --config epochs=2 --config fail_step=14"
                                  " --config marker=" + marker));
    INFO(run.output);
    REQUIRE(run.exit_code == 0);
    CHECK(run.output.find("was killed by SIGKILL") != std::string::npos);
    CHECK(trained(run.output) == each_trained(2));
  }
}

TEST_CASE("sharded data: a run killed on 2 ranks and run again on 3 trains what the 2 had not") {
  Sandbox box;
  const auto spec = pack_samples(box);
  for (const char* entry : {"fit", "loop"}) {
    CAPTURE(entry);
    const std::string name = std::string("regroup-") + entry;
    // Without --max-failures the kill ends the run; its latest checkpoint is
    // step 12 of epoch 0: 240 samples consumed, 360 left, 120 for each of 3.
    const auto marker = (box.root() / (name + "-failed")).string();
    auto first = box.run(shards_run(spec, entry, name,
                                    "-n 2 --config epochs=2 --config fail_step=14 --config marker=" +
                                        marker));
    INFO(first.output);
    REQUIRE(first.exit_code != 0);
    auto again = box.run(shards_run(spec, entry, name, "-n 3 --config epochs=2"));
    INFO(again.output);
    REQUIRE(again.exit_code == 0);
    CHECK(trained(again.output) == each_trained(2));
  }
}

TEST_CASE("sharded data: with --recovery in-place a replacement reads the lost rank's part on") {
  Sandbox box;
  const auto spec = pack_samples(box);
  // 3 ranks, 200 samples each per epoch, 20 steps; rank 1 dies after step 4.
  // The survivors go on without it until its replacement joins, which takes
  // the lost rank's span at their position: no sample is trained twice in an
  // epoch, and only the lost rank's samples of the steps it missed are not.
  const auto marker = (box.root() / "failed").string();
  auto run = box.run(shards_run(spec, "fit", "in-place",
                                "-n 3 --recovery in-place --max-failures 1 --config epochs=3"
                                " --config fail_step=4 --config step_sleep_ms=150 --config marker=" +
                                    marker));
  INFO(run.output);
  REQUIRE(run.exit_code == 0);
  CHECK(run.output.find("go on in place") != std::string::npos);
  CHECK(run.output.find("caught up from rank") != std::string::npos);
  // Each epoch: every sample once (1), or 1.5 in a step of the 2 survivors,
  // or not at all (0) in the lost rank's share of those steps; the
  // replacement went on from its position: nothing twice, nothing else missed.
  int gap_samples = 0;
  for (int epoch = 0; epoch < 3; ++epoch) {
    CAPTURE(epoch);
    std::smatch match;
    REQUIRE(std::regex_search(run.output, match,
                              std::regex("epoch " + std::to_string(epoch) +
                                         " zeros=([0-9]+) ones=([0-9]+) halves=([0-9]+) other=([0-9]+)")));
    const int zeros = std::stoi(match[1]), halves = std::stoi(match[3]);
    CHECK(std::stoi(match[4]) == 0);
    CHECK(2 * zeros == halves);
    gap_samples += halves;
  }
  CHECK(gap_samples > 0);  // "the 2 left applied step N": a step without rank 1
}

TEST_CASE("sharded data: an elastic group that grows from 2 to 3 mid-run trains what the 2 had not") {
  Sandbox box;
  const auto spec = pack_samples(box);
  // -n 2:3 with one agent of 2 workers: it starts with 2 (at the startup
  // timeout, long enough for a loaded machine to start them); an agent of 1 joins
  // after the first checkpoint, and the group grows to 3 at a later one. Any
  // checkpoint (every 6 steps of 2 x 10) leaves a multiple of 3 x 10 samples
  // of the epoch: no padding, each sample exactly once per epoch.
  // The ranks wait at step 8 until the new agent has joined: the group grows
  // at the checkpoint of step 12 however slowly the agent starts.
  const auto joined = (box.root() / "joined").string();
  auto run = start_agents(box,
                          shards_run(spec, "fit", "elastic",
                                     "--startup-timeout 20 --config epochs=2"
                                     " --config await_step=8 --config await_file=" + joined),
                          3, 1, 2, "2:3");
  REQUIRE(wait_for_lines(box, "-> checkpoint_000000", 1));
  const pid_t joining = add_agent(box, run, 1, "agent-late.txt");
  REQUIRE(wait_for_lines(box, "joined with 1 worker", 1));
  std::ofstream(joined) << "joined\n";
  CHECK(Sandbox::wait(run.controller) == 0);
  CHECK(Sandbox::wait(run.agents[0]) == 0);
  CHECK(Sandbox::wait(joining) == 0);
  const auto output = box.output_so_far();
  INFO(output);
  CHECK(output.find("the group grows from 2") != std::string::npos);
  CHECK(trained(output) == each_trained(2));
}
