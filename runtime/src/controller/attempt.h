#pragma once

// Everything that belongs to one attempt of a run: its workers, its report
// barrier, its process group's store, its failures, the asynchronous
// checkpoint it uploads and the uploads it owes. The controller makes a new one
// for each attempt, so that nothing of a failed attempt is carried into the
// next by a field someone forgot to reset. What outlives an attempt (the
// socket, node agents, standby workers, the run's records) stays in the
// Controller. Owned by the controller's thread.

#include <nlohmann/json.hpp>

#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "common/clock.h"
#include "controller/failure.h"
#include "controller/rank_assignment.h"
#include "controller/rendezvous_store.h"
#include "controller/report_coordinator.h"
#include "controller/worker_pool.h"
#include "protocol/messages.h"

namespace trainrun {

struct Attempt {
  /// Attempt `number` (1 for the first) of a run of at most `max_workers`, whose
  /// reports continue from `iteration_offset`, on `pool` (new workers, or the
  /// standby workers of the last attempt).
  Attempt(int number, int max_workers, int64_t iteration_offset, std::unique_ptr<WorkerPool> pool,
          Clock::time_point now)
      : number(number),
        started(now),
        world_size(max_workers),
        pool(std::move(pool)),
        reports(max_workers, iteration_offset),
        store(RendezvousStore::capacity_for(max_workers)),
        next_timer_check(now) {}

  /// The asynchronous checkpoint being uploaded (REPORT with `async`): at most
  /// one at a time. Reports with a checkpoint that come while it uploads wait,
  /// unanswered, for its commit.
  struct AsyncCheckpoint {
    bool released = false;  // its report was acknowledged and recorded
    int64_t iteration = 0;  // ... as this iteration
    nlohmann::json metrics;
    Clock::time_point reported;
    std::vector<int> absent;  // the ranks lost in place, not yet replaced, when reported
  };

  /// Every rank's stacks being collected (STACKS, then STACKS_REPLY): at most
  /// one collection at a time, written when all answered or at `deadline`.
  struct StackCollection {
    int64_t id = 0;
    std::string reason;
    Clock::time_point deadline;
    std::vector<const WorkerSlot*> asked;
    std::map<const WorkerSlot*, std::vector<protocol::ThreadStack>> answers;
  };

  /// The current report's wait: since when some rank waits in it, and whether
  /// the stacks were taken for it.
  struct ReportWait {
    int64_t iteration = 0;
    Clock::time_point since;
    bool stacks_taken = false;
  };

  /// In-place recovery: the open vote on a synchronised step, which every
  /// member of the current generation must cast before any applies it.
  struct StepVotes {
    int64_t step = 0;
    std::vector<int> ranks;  // who voted, by arrival
  };

  bool assigned() const { return assigned_at.has_value(); }

  const int number;
  const Clock::time_point started;
  int world_size;  // the most until the ranks are assigned, then the group's
  std::unique_ptr<WorkerPool> pool;
  ReportCoordinator reports;
  RendezvousStore store;
  FailureCollector failures;
  std::optional<Clock::time_point> assigned_at;  // when the ranks were assigned
  int hellos = 0;                                // workers connected
  int reported = 0;                              // reports recorded
  int plugin_downloads = 0;  // workers that fetched the plugin (the rest had it cached)
  // The workers node agents said they started for it (process_key), and how many.
  std::unordered_set<std::string> claimed;
  int agent_claims = 0;
  std::optional<AsyncCheckpoint> async_checkpoint;
  std::vector<std::pair<int, protocol::Report>> deferred_reports;  // by rank
  std::map<int, protocol::Upload> owed_uploads;  // by rank, until its upload connection attaches
  Clock::time_point next_timer_check;            // startup and heartbeat timeouts
  std::optional<StackCollection> stacks;
  std::optional<ReportWait> report_wait;
  // Where each rank's train function was in the last stacks written (by
  // rank), and the file: what a report's timeout names.
  std::map<int, std::string> train_places;
  std::string stacks_file;
  // In-place recovery (controller_recovery.cpp): the group's generation (0:
  // the ranks as assigned), its members' world ranks in group rank order,
  // the open vote, the last step applied, and the recoveries not yet timed
  // (indices into the attempt's AttemptInfo::recoveries, with when each began).
  int64_t generation = 0;
  std::vector<int> members;
  std::optional<StepVotes> votes;
  int64_t applied_step = 0;
  int group_taken_by = -1;            // a rank whose train function took the process group itself
  std::vector<int> lost_unannounced;  // left the group this pass; PEER_LOST goes at its end
  std::vector<std::pair<size_t, Clock::time_point>> untimed_recoveries;
  // Where each rank runs (by rank), for a replacement's ASSIGN; the ranks
  // whose train functions take a replacement at their step boundaries (JOINABLE).
  std::vector<Placement> placements;
  std::set<int> joinable;
  /// A worker started in place of a lost rank: ready once it waits to join
  /// (its JOINABLE); then the next applied step's decision names the group
  /// with it (`generation`, `members`), which the others form at their next
  /// step boundary; it is a member from the first vote in that group.
  struct Replacement {
    int rank = -1;
    int index = -1;             // its slot's launch index
    size_t record = 0;          // the recovery it completes (AttemptInfo::recoveries)
    Clock::time_point lost_at;  // when the rank it replaces was lost
    bool ready = false;
    int64_t generation = 0;  // 0 until a decision announced its group
    std::vector<int> members;
    // A rank that needs one (rank 0, or one that writes into the
    // checkpoints): the loss the group restarts for if it never joins.
    std::optional<RunError> loss;
    bool loop_left = false;  // ... and a member left its loop: it cannot join
  };
  std::optional<Replacement> replacement;
  // Each rank lost in place, as its failure: what the attempt fails with if
  // the group must restart without it after all.
  std::map<int, RunError> losses;
  // A replacement that joined, until its group's first step is applied: the
  // recovery it completes, and when that rank was lost.
  std::optional<std::pair<size_t, Clock::time_point>> untimed_join;
};

}  // namespace trainrun
