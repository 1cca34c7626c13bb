// How a node agent reads Slurm's environment (values as Slurm 22.05 sets them).

#include <doctest/doctest.h>

#include <trainrun/error.h>

#include <cstdlib>
#include <map>
#include <string>

#include "agent/node_agent.h"

namespace {

// Sets the SLURM_ variables for one case, and clears them again.
struct SlurmEnvironment {
  explicit SlurmEnvironment(const std::map<std::string, std::string>& values) {
    for (const auto& [name, value] : values) ::setenv(name.c_str(), value.c_str(), 1);
  }
  ~SlurmEnvironment() {
    for (const char* name : {"SLURM_JOB_ID", "SLURM_NTASKS_PER_NODE", "SLURM_STEP_NUM_TASKS",
                             "SLURM_STEP_NUM_NODES"}) {
      ::unsetenv(name);
    }
  }
};

}  // namespace

TEST_CASE("a node agent in a step of one task per node starts the job's tasks per node") {
  SUBCASE("outside Slurm: one worker, no agent") {
    CHECK_FALSE(trainrun::slurm_workers_per_node().has_value());
  }
  SUBCASE("srun --nodes=2 --ntasks=2 in a job of --ntasks-per-node=4") {
    SlurmEnvironment env({{"SLURM_JOB_ID", "7"}, {"SLURM_NTASKS_PER_NODE", "4"},
                          {"SLURM_STEP_NUM_TASKS", "2"}, {"SLURM_STEP_NUM_NODES", "2"}});
    CHECK(trainrun::slurm_workers_per_node() == 4);
  }
  SUBCASE("srun -n 4 over 2 nodes: each task is a worker") {
    SlurmEnvironment env({{"SLURM_JOB_ID", "7"}, {"SLURM_NTASKS_PER_NODE", "2"},
                          {"SLURM_STEP_NUM_TASKS", "4"}, {"SLURM_STEP_NUM_NODES", "2"}});
    CHECK_FALSE(trainrun::slurm_workers_per_node().has_value());
  }
  SUBCASE("a job without --ntasks-per-node: no count to take") {
    SlurmEnvironment env({{"SLURM_JOB_ID", "7"}, {"SLURM_STEP_NUM_TASKS", "1"},
                          {"SLURM_STEP_NUM_NODES", "1"}});
    CHECK_FALSE(trainrun::slurm_workers_per_node().has_value());
  }
  SUBCASE("the batch script itself, not a step") {
    SlurmEnvironment env({{"SLURM_JOB_ID", "7"}, {"SLURM_NTASKS_PER_NODE", "2"}});
    CHECK_FALSE(trainrun::slurm_workers_per_node().has_value());
  }
  SUBCASE("a malformed count is a usage error") {
    SlurmEnvironment env({{"SLURM_JOB_ID", "7"}, {"SLURM_NTASKS_PER_NODE", "two"},
                          {"SLURM_STEP_NUM_TASKS", "1"}, {"SLURM_STEP_NUM_NODES", "1"}});
    CHECK_THROWS_AS(trainrun::slurm_workers_per_node(), trainrun::UsageError);
  }
}
