// How a node agent reads Slurm's environment (values as Slurm 22.05 sets them).

#include <trainrun/error.h>

#include <doctest/doctest.h>

#include <cstdlib>
#include <map>
#include <string>

#include "agent/node_agent.h"

namespace {

constexpr const char* kNames[] = {"SLURM_JOB_ID", "SLURM_NTASKS_PER_NODE", "SLURM_STEP_NUM_TASKS",
                                  "SLURM_STEP_NUM_NODES"};

// Sets exactly these SLURM_ variables for one case (the suite may itself run
// inside a Slurm job), and puts back what was there.
struct SlurmEnvironment {
  explicit SlurmEnvironment(const std::map<std::string, std::string>& values) {
    for (const char* name : kNames) {
      if (const char* value = std::getenv(name)) saved_[name] = value;
      ::unsetenv(name);
    }
    for (const auto& [name, value] : values) ::setenv(name.c_str(), value.c_str(), 1);
  }
  ~SlurmEnvironment() {
    for (const char* name : kNames) ::unsetenv(name);
    for (const auto& [name, value] : saved_) ::setenv(name.c_str(), value.c_str(), 1);
  }
  std::map<std::string, std::string> saved_;
};

}  // namespace

TEST_CASE("a node agent in a step of one task per node starts the job's tasks per node") {
  SUBCASE("outside Slurm: one worker, no agent") {
    SlurmEnvironment env({});
    CHECK_FALSE(trainrun::slurm_workers_per_node().has_value());
  }
  SUBCASE("the same count on every node, as Slurm abbreviates it") {
    SlurmEnvironment env({{"SLURM_JOB_ID", "7"},
                          {"SLURM_NTASKS_PER_NODE", "4(x3)"},
                          {"SLURM_STEP_NUM_TASKS", "3"},
                          {"SLURM_STEP_NUM_NODES", "3"}});
    CHECK(trainrun::slurm_workers_per_node() == 4);
  }
  SUBCASE("srun --nodes=2 --ntasks=2 in a job of --ntasks-per-node=4") {
    SlurmEnvironment env({{"SLURM_JOB_ID", "7"},
                          {"SLURM_NTASKS_PER_NODE", "4"},
                          {"SLURM_STEP_NUM_TASKS", "2"},
                          {"SLURM_STEP_NUM_NODES", "2"}});
    CHECK(trainrun::slurm_workers_per_node() == 4);
  }
  SUBCASE("srun -n 4 over 2 nodes: each task is a worker") {
    SlurmEnvironment env({{"SLURM_JOB_ID", "7"},
                          {"SLURM_NTASKS_PER_NODE", "2"},
                          {"SLURM_STEP_NUM_TASKS", "4"},
                          {"SLURM_STEP_NUM_NODES", "2"}});
    CHECK_FALSE(trainrun::slurm_workers_per_node().has_value());
  }
  SUBCASE("a job without --ntasks-per-node: no count to take") {
    SlurmEnvironment env(
        {{"SLURM_JOB_ID", "7"}, {"SLURM_STEP_NUM_TASKS", "1"}, {"SLURM_STEP_NUM_NODES", "1"}});
    CHECK_FALSE(trainrun::slurm_workers_per_node().has_value());
  }
  SUBCASE("the batch script itself, not a step") {
    SlurmEnvironment env({{"SLURM_JOB_ID", "7"}, {"SLURM_NTASKS_PER_NODE", "2"}});
    CHECK_FALSE(trainrun::slurm_workers_per_node().has_value());
  }
  SUBCASE("a malformed count, or different counts per node, is a usage error") {
    for (const char* value : {"two", "3,2", "0", "2(x3),1"}) {
      SlurmEnvironment env({{"SLURM_JOB_ID", "7"},
                            {"SLURM_NTASKS_PER_NODE", value},
                            {"SLURM_STEP_NUM_TASKS", "1"},
                            {"SLURM_STEP_NUM_NODES", "1"}});
      CHECK_THROWS_AS(trainrun::slurm_workers_per_node(), trainrun::UsageError);
    }
  }
}
