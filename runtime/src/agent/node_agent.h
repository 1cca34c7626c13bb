#pragma once

// A node agent: `trainrun worker --connect ENDPOINT --nproc N` on each machine
// starts N worker processes there and supervises them, as torchrun's per-node
// agent does. On a connection of its own it tells the controller which
// workers it started (AGENT), forwards what they write (OUTPUT) and how each
// ended (EXITED), so the controller's logs and root cause are the same as for
// local workers. It ends its workers when the controller says SHUTDOWN or goes
// silent, and when the agent itself is told to stop (SIGTERM, SIGINT, SIGHUP:
// what Slurm's scancel sends); a killed agent takes them with it (each asks
// for a signal on its parent's death). Between attempts of a run with
// --max-failures it stays: SHUTDOWN with restart ends its workers, RESTART
// starts new ones, announced by a new AGENT. Workers that exit on their own
// (finished, crashed) leave it waiting for the controller's word; it exits
// once it has that word (or the controller's silence, or a signal) and all
// its workers have exited.

#include <chrono>
#include <filesystem>
#include <optional>
#include <string>

#include "common/run_key.h"

namespace trainrun {

struct AgentOptions {
  int nproc = 1;        // workers to start
  std::string connect;  // the controller's endpoint
  std::filesystem::path worker_executable;
  std::filesystem::path cache_dir;  // shared by the workers: one plugin download per host
  std::chrono::milliseconds startup_timeout{0};  // theirs, and the agent's for AGENT_ACCEPTED
  std::filesystem::path key_file;                // the run key, given to each worker
  std::optional<RunKeys> keys;                   // derived from it: the agent's own CURVE
  std::string interface;                         // each worker's --interface
};

/// Runs the agent; returns the process exit code: 0 when every worker of the
/// last attempt exited with 0, 1 otherwise, 2 when the controller refused the
/// agent.
int run_agent(const AgentOptions& options);

/// The number of workers a Slurm step's agent starts on its node: in a step of
/// one task per node (SLURM_STEP_NUM_TASKS equal to SLURM_STEP_NUM_NODES), the
/// job's tasks per node, SLURM_NTASKS_PER_NODE (which the step inherits from
/// the batch script unless srun is given --ntasks-per-node). Nothing outside
/// Slurm, in a step of several tasks per node (each task is a worker), or
/// without SLURM_NTASKS_PER_NODE. Throws UsageError on a malformed value.
std::optional<int> slurm_workers_per_node();

}  // namespace trainrun
