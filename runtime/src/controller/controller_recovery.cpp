// Recovery in place (FailureConfig::in_place): a rank that dies while every
// rank trains leaves the group, and the others go on without it in a new
// generation of the group, the step in flight done again there. Each
// synchronised step is applied only once every member of the generation has
// voted that its collectives completed: a step some rank could not complete is
// applied by none, and done again by all. docs/design.md, "Recovery in place".

#include <signal.h>

#include <algorithm>

#include "controller/controller.h"
#include "storage/run_directory.h"

namespace trainrun {

std::optional<std::string> Controller::in_place_refusal(const WorkerSlot& lost) const {
  const auto& failure = setup_.options.failure;
  if (!failure.in_place || !attempt_ || lost.rank < 0 || lost.done || lost.departed) {
    return std::nullopt;
  }
  if (!records()) return "the attempt was already failing";
  if (failure.max_failures >= 0 && failures_used_ >= failure.max_failures) {
    return "no failures left to survive";
  }
  const auto& attempt = *attempt_;
  const int left = static_cast<int>(attempt.members.size()) - 1;
  // An elastic run keeps its fewest; any other goes on while one rank is left.
  if (left < (elastic() ? min_workers() : 1)) {
    return std::to_string(left) + " ranks would be left, fewer than the run needs";
  }
  for (int rank : attempt.members) {
    const WorkerSlot* member = attempt.pool->at_rank(rank);
    if (rank == lost.rank || member == nullptr) continue;
    if (!member->started) return "rank " + std::to_string(rank) + " had not started training";
    if (member->failed || member->exited || member->done) {
      return "rank " + std::to_string(rank) + " had ended too";
    }
  }
  if (checkpoints_.staging() || attempt.async_checkpoint) return "a checkpoint was uploading";
  if (attempt.replacement && attempt.replacement->generation != 0) {
    return "rank " + std::to_string(attempt.replacement->rank) +
           "'s replacement was joining the group";
  }
  if (attempt.group_taken_by >= 0) {
    return "rank " + std::to_string(attempt.group_taken_by) +
           "'s train function took train::process_group() itself, and its own collectives "
           "cannot be done again in a new group";
  }
  // A train function saves its checkpoint on rank 0 (`if (world_rank == 0)`),
  // or a shard on each rank: the others go on without a rank that writes
  // only until its replacement joins (meanwhile no checkpoint is kept).
  if (needs_replacement(lost.rank)) {
    auto why = replacement_refusal(lost);
    if (!why.empty()) {
      return "it was rank " + std::to_string(lost.rank) + ", which " +
             (lost.rank == 0 ? "saves the checkpoints"
                             : "writes into the checkpoints (it wrote into the last one)") +
             ", and no replacement can take its place: " + why;
    }
  }
  return "";
}

bool Controller::recover_in_place(WorkerSlot& lost, FailureKind kind, const std::string& cause) {
  if (pending_replacement(lost)) {
    // Once its group was announced the others wait for it there: they restart.
    if (attempt_->replacement->generation != 0) return false;
    drop_replacement(cause + " before it joined");
    return true;
  }
  auto refusal = in_place_refusal(lost);
  if (!refusal) return false;  // not asked for
  if (!refusal->empty()) {
    log_.warn("{} {}: no recovery in place ({}), the group restarts", lost.describe(), cause,
              *refusal);
    return false;
  }
  auto& attempt = *attempt_;
  ++failures_used_;
  lost.departed = true;
  attempt.joinable.erase(lost.rank);
  attempt.members.erase(std::remove(attempt.members.begin(), attempt.members.end(), lost.rank),
                        attempt.members.end());
  // By world rank again (a replacement that joined came last): the group's
  // first rank, which saves and sends for the others, is the lowest left.
  std::sort(attempt.members.begin(), attempt.members.end());
  attempt.lost_unannounced.push_back(lost.rank);
  const int64_t step = attempt.votes ? attempt.votes->step : attempt.applied_step + 1;
  InPlaceRecovery record;
  record.rank = lost.rank;
  record.host = lost.host;
  record.pid = lost.process.pid;
  record.cause = cause;
  record.at = run_directory::timestamp_now();
  record.world_size = static_cast<int>(attempt.members.size());
  record.step = step;
  auto& recoveries = attempts_.back().recoveries;
  recoveries.push_back(record);
  attempt.untimed_recoveries.emplace_back(recoveries.size() - 1, now());
  notify_attempts();
  const int max_failures = setup_.options.failure.max_failures;
  const auto others = attempt.members.size() == 1
                          ? std::string("the last rank goes")
                          : "the other " + std::to_string(attempt.members.size()) + " go";
  log_.warn("{} {}: {} on in place at step {}{}", lost.describe(), cause, others, step,
            max_failures < 0 ? ""
                             : " (" + std::to_string(max_failures - failures_used_) +
                                   " more failures survived)");
  // A report, or the arrival before one, that waited for the lost rank.
  attempt.reports.depart(lost.rank);
  if (attempt.reports.any_early() && attempt.reports.early_complete()) {
    const int64_t iteration = attempt.reports.iteration();
    attempt.reports.release_early();
    for (int rank : attempt.members) {
      to_train(*pool().at_rank(rank), protocol::ArriveAck{iteration});
    }
  }
  if (attempt.reports.complete()) {
    release_report();
  } else {
    check_stalled();
  }
  RunError loss{kind, cause, lost.display_rank(), lost.host, lost.process.pid};
  attempt.losses[lost.rank] = loss;
  start_replacement(lost, std::move(loss));
  return true;
}

std::string Controller::replacement_refusal(const WorkerSlot& lost) const {
  const auto& attempt = *attempt_;
  if (attempt.replacement) {
    return "rank " + std::to_string(attempt.replacement->rank) + "'s replacement is on its way";
  }
  if (lost.remote || lost.in_process()) {
    return "its worker was not started by the controller (a node agent's or a remote one)";
  }
  for (int rank : attempt.members) {
    if (attempt.joinable.count(rank) == 0) {
      return "rank " + std::to_string(rank) +
             "'s train function does not take one at its step boundaries (train::Trainer's and "
             "a loop over loader.epochs() with a known optimizer do)";
    }
  }
  if (!pool().has_room()) return "the attempt started as many replacements as it has ranks";
  return "";
}

void Controller::start_replacement(const WorkerSlot& lost, RunError loss) {
  const int rank = lost.rank;
  auto refusal = replacement_refusal(lost);
  if (!refusal.empty()) {
    log_.info("no replacement for rank {} ({}): the group goes on with {} ranks", rank, refusal,
              attempt_->members.size());
    return;
  }
  try {
    auto& worker = pool().spawn_replacement(launch_, rank);
    worker.replacing_since = now();
    attempt_->replacement =
        Attempt::Replacement{rank, worker.index, attempts_.back().recoveries.size() - 1, now()};
    if (needs_replacement(rank)) attempt_->replacement->loss = std::move(loss);
    log_.info(
        "started a worker (pid {}) in place of rank {}: it joins the group at a step "
        "boundary, with the state of a peer",
        worker.process.pid, rank);
  } catch (const std::exception& e) {
    if (needs_replacement(rank)) {
      restart_without_writer(rank, std::move(loss), std::string("could not start: ") + e.what());
      return;
    }
    log_.warn("no replacement for rank {} ({}): the group goes on with {} ranks", rank, e.what(),
              attempt_->members.size());
  }
}

void Controller::restart_without_writer(int rank, RunError loss, const std::string& why) {
  // An attempt that fails already ends for its own failure, counted then.
  if (!records()) {
    log_.warn("rank {}'s replacement {}", rank, why);
    return;
  }
  // The loss was counted when the others went on; the attempt's failure is
  // that loss, counted again as it ends.
  --failures_used_;
  log_.warn("rank {}'s replacement {}: {}, so the group restarts from the latest", rank, why,
            rank == 0 ? "no other rank saves the checkpoints"
                      : "no checkpoint is whole without the files it writes");
  loss.message += " (the others went on in place, and its replacement " + why + ")";
  record_failure(std::move(loss));
}

bool Controller::pending_replacement(const WorkerSlot& worker) const {
  return attempt_ && attempt_->replacement && attempt_->replacement->index == worker.index &&
         !worker.remote;
}

void Controller::assign_replacement(WorkerSlot& worker) {
  auto assign = assign_for(worker, attempt_->placements.at(static_cast<size_t>(worker.rank)));
  assign.joining = true;
  to_main(worker, assign);
}

void Controller::on_joinable(WorkerSlot& worker, bool joinable) {
  auto& attempt = *attempt_;
  if (worker.departed) return;
  if (pending_replacement(worker)) {
    attempt.replacement->ready = joinable;
    return;
  }
  if (joinable) {
    attempt.joinable.insert(worker.rank);
    return;
  }
  attempt.joinable.erase(worker.rank);
  if (!attempt.replacement) return;
  // Rank 0's will find no group either, and what the train functions save
  // after their loop would lack its files: the group restarts, once this
  // member returns (on_done). Not now: a loop left by an exception says so
  // first, and the exception is the attempt's failure.
  if (attempt.replacement->loss) {
    attempt.replacement->loop_left = true;
    return;
  }
  // The members' loop ended before its next step boundary: the group the
  // replacement waits for will not form.
  if (attempt.replacement->generation != 0) {
    drop_replacement("could not join: the train functions left their loop first");
  }
}

void Controller::drop_replacement(const std::string& why) {
  auto& attempt = *attempt_;
  auto replacement = std::move(*attempt.replacement);
  attempt.replacement.reset();
  if (WorkerSlot* worker = pool().at_index(replacement.index)) {
    worker->departed = true;
    worker->replacing_since.reset();
    if (!worker->exited) ::kill(static_cast<pid_t>(worker->process.pid), SIGKILL);
  }
  if (replacement.loss) {
    restart_without_writer(replacement.rank, std::move(*replacement.loss), why);
    return;
  }
  log_.warn("rank {}'s replacement {}: the group goes on with {} ranks", replacement.rank, why,
            attempt.members.size());
}

// Once per pass of the loop, so that ranks lost together (a node's) make one
// generation, not one each whose rendezvous would wait for the next loss.
void Controller::announce_losses() {
  if (!attempt_ || attempt_->lost_unannounced.empty() || !records()) return;
  auto& attempt = *attempt_;
  ++attempt.generation;
  // The step being voted on is applied by no one: those who voted are told,
  // the others find their group ended, and all do it again in the next one.
  if (attempt.votes) {
    for (int rank : attempt.votes->ranks) {
      const WorkerSlot* voter = pool().at_rank(rank);
      if (voter != nullptr && !voter->departed) {
        to_train(*voter, protocol::StepDecision{attempt.votes->step, false});
      }
    }
    attempt.votes.reset();
  }
  protocol::PeerLost message{
      attempt.generation, std::vector<int32_t>(attempt.members.begin(), attempt.members.end()),
      std::vector<int32_t>(attempt.lost_unannounced.begin(), attempt.lost_unannounced.end())};
  attempt.lost_unannounced.clear();
  for (int rank : attempt.members) to_main(*pool().at_rank(rank), message);
}

void Controller::on_step_vote(WorkerSlot& worker, const protocol::StepVote& vote) {
  if (!records()) return;  // the attempt fails or stops: its workers are about to
  auto& attempt = *attempt_;
  if (!setup_.options.failure.in_place) throw ProtocolError("STEP_VOTE without recovery in place");
  // The first vote in the group with the replacement: every rank of the old
  // one has passed the step boundary (the group formed with all of them), and
  // the replacement is a member from here.
  if (attempt.replacement && attempt.replacement->generation != 0 &&
      vote.generation == attempt.replacement->generation) {
    const auto joined = *attempt.replacement;
    attempt.replacement.reset();
    attempt.generation = joined.generation;
    attempt.members = joined.members;
    attempt.reports.rejoin(joined.rank);
    attempt.joinable.insert(joined.rank);  // its own Trainer loop runs
    if (WorkerSlot* replacement = pool().at_index(joined.index)) {
      replacement->replacing_since.reset();
      attempts_.back().recoveries.at(joined.record).replacement_pid = replacement->process.pid;
    }
    attempt.untimed_join.emplace(joined.record, joined.lost_at);
  }
  if (worker.departed || std::find(attempt.members.begin(), attempt.members.end(), worker.rank) ==
                             attempt.members.end()) {
    throw ProtocolError("STEP_VOTE from a rank outside the group");
  }
  if (vote.generation < attempt.generation) {  // its group ended: the step is done again
    to_train(worker, protocol::StepDecision{vote.step, false});
    return;
  }
  if (vote.generation > attempt.generation || vote.step <= attempt.applied_step) {
    throw ProtocolError("STEP_VOTE for step " + std::to_string(vote.step) + " of group " +
                        std::to_string(vote.generation) + " while the group is " +
                        std::to_string(attempt.generation) + " after step " +
                        std::to_string(attempt.applied_step));
  }
  if (!attempt.votes) attempt.votes = Attempt::StepVotes{vote.step, {}};
  auto& votes = *attempt.votes;
  if (votes.step != vote.step) {
    fail(worker, FailureKind::kUsage,
         "synchronised its step " + std::to_string(vote.step) + " while rank " +
             std::to_string(votes.ranks.front()) + " synchronised its step " +
             std::to_string(votes.step) +
             ": every rank must run as many backward passes through its prepared models");
    return;
  }
  if (std::find(votes.ranks.begin(), votes.ranks.end(), worker.rank) != votes.ranks.end()) {
    throw ProtocolError("a second STEP_VOTE on one step");
  }
  votes.ranks.push_back(worker.rank);
  // Applied once every member voted. A rank lost since (its agent's word can
  // come in the same pass as a vote) keeps the step from being applied: its
  // vote does not count, and announce_losses tells the voters to do the step
  // again in the survivors' group.
  if (!attempt.lost_unannounced.empty()) return;
  for (int rank : attempt.members) {
    if (std::find(votes.ranks.begin(), votes.ranks.end(), rank) == votes.ranks.end()) return;
  }
  protocol::StepDecision decision{vote.step, true};
  decision.reports = attempt.reports.iteration() - 1;  // a replacement's count begins there
  auto& replacement = attempt.replacement;
  // (Not while ranks lost this pass wait for their generation: it is that one.)
  if (replacement && replacement->ready && replacement->generation == 0 &&
      attempt.lost_unannounced.empty() &&
      std::all_of(attempt.members.begin(), attempt.members.end(),
                  [&](int rank) { return attempt.joinable.count(rank) > 0; })) {
    // Its group: the members and it. Each member forms it at
    // its next step boundary, the replacement as soon as it hears.
    replacement->generation = attempt.generation + 1;
    // It comes last: the group's first rank, which sends it the state, is a
    // member's (rank 0's replacement too gets it from the lowest rank left;
    // the next loss sorts the members by world rank again).
    replacement->members = attempt.members;
    replacement->members.push_back(replacement->rank);
    decision.join = replacement->generation;
    decision.ranks.assign(replacement->members.begin(), replacement->members.end());
    to_main(*pool().at_index(replacement->index),
            protocol::PeerLost{replacement->generation, decision.ranks, {}});
    log_.info("rank {}'s replacement joins the group after step {}", replacement->rank, vote.step);
  }
  for (int rank : attempt.members) to_train(*pool().at_rank(rank), decision);
  attempt.applied_step = vote.step;
  attempt.votes.reset();
  if (attempt.untimed_join) {
    auto [index, began] = *attempt.untimed_join;
    attempt.untimed_join.reset();
    auto& record = attempts_.back().recoveries.at(index);
    record.caught_up_seconds = std::chrono::duration<double>(now() - began).count();
    log_.info("rank {}'s replacement caught up: {} ranks applied step {}, {:.3f} s after the loss",
              record.rank, attempt.members.size(), vote.step, record.caught_up_seconds);
    notify_attempts();
  }
  if (attempt.untimed_recoveries.empty()) return;
  auto& recoveries = attempts_.back().recoveries;
  for (auto [index, began] : attempt.untimed_recoveries) {
    auto& record = recoveries[index];
    record.seconds = std::chrono::duration<double>(now() - began).count();
    record.steps_lost = vote.step - record.step;
    log_.info("rank {} lost: the {} left applied step {} {:.3f} s later ({} steps lost)",
              record.rank, attempt.members.size(), vote.step, record.seconds, record.steps_lost);
  }
  attempt.untimed_recoveries.clear();
  notify_attempts();
}

}  // namespace trainrun
