// One attempt: a group of workers started (or the standby ones taken), its
// ranks assigned once enough are here, served until it finishes, fails or
// regroups; the back-off before the next one; the standby workers that make
// a restart cheap. The loop that serves it is in controller_liveness.cpp.

#include <trainrun/error.h>

#include <unistd.h>

#include <csignal>
#include <thread>

#include "common/constants.h"
#include "common/seconds.h"
#include "controller/controller.h"
#include "controller/rank_assignment.h"
#include "storage/run_directory.h"

namespace trainrun {

void Controller::start_attempt() {
  const int number = attempt_ ? attempt_->number + 1 : 1;
  auto workers = carry_over();
  // After the agents were judged: dropping what a failed attempt staged may take a while.
  if (number > 1) checkpoints_.begin_attempt(number);
  const bool standby = workers->size() > 0;
  attempt_ = std::make_unique<Attempt>(
      number, max_workers(), storage_.last_result() ? storage_.last_result()->iteration : 0,
      std::move(workers), now());
  watch_pool();
  // The standby workers said HELLO while the last attempt ran.
  attempt_->hellos =
      static_cast<int>(std::count_if(pool().workers().begin(), pool().workers().end(),
                                     [](const WorkerSlot& w) { return w.main_id.has_value(); }));
  enter(RunPhase::kGathering);
  AttemptInfo info;
  info.attempt = setup_.attempt_offset + number;
  info.world_size = max_workers();  // until the ranks are assigned
  info.started_at = run_directory::timestamp_now();
  info.resumed_from = checkpoints_.resume_dir().empty() ? ""
                      : checkpoints_.resume_dir().parent_path() == storage_.dir()
                          ? checkpoints_.resume_dir().filename().string()
                          : checkpoints_.resume_dir().string();
  attempts_.push_back(info);
  notify_attempts();
  if (number > 1) {
    log_.info("attempt {} starts from {}", setup_.attempt_offset + number,
              info.resumed_from.empty() ? "the start" : info.resumed_from);
    // Node agents start this attempt's workers and announce them with AGENT.
    for (auto& [id, agent] : agents_) to_agent(id, agent, protocol::Restart{number});
  }
  const int local = setup_.options.scaling.local_workers;
  if (standby) {
    log_.info("attempt {} takes the {} standby workers", setup_.attempt_offset + number,
              pool().size());
    maybe_assign();
    return;
  }
  try {
    pool().spawn(local, launch_);
    if (number == 1 && launch_.in_process) {
      log_.info("running the train function in this process (pid {}, {} threads)", ::getpid(),
                setup_.cpus_per_worker);
    } else if (number == 1) {
      log_.info("listening on {}; started {} workers ({} threads each)", launch_.endpoint, local,
                setup_.cpus_per_worker);
    }
  } catch (const IoError& e) {
    record_failure(RunError{FailureKind::kSetup, e.what(), -1, "", 0});
    log_.error("{}", e.what());
  }
}

std::unique_ptr<WorkerPool> Controller::carry_over() {
  // Agents are judged first: what follows may take seconds without reading the socket.
  carry_over_agents();
  reap_standby();  // one that died while the last attempt stopped is not taken
  if (standby_ready()) return std::move(standby_);
  stop_standby();
  auto workers = std::make_unique<WorkerPool>();
  workers->reserve(max_workers(), spare_workers());
  return workers;
}

Controller::AttemptEnd Controller::run_attempt() {
  std::optional<AttemptEnd> end;
  try {
    serve_until(Clock::time_point::max(), [&] { return (end = attempt_end()).has_value(); });
  } catch (const std::exception& e) {
    // The last line of defence: whatever escaped a handler ends the run as
    // a failure with a final status and error.json, not as a crash.
    RunError error{FailureKind::kInternal, std::string("internal error: ") + e.what(), -1, "", 0};
    log_.error("{}", error.message);
    return {error};
  }
  return *end;
}

std::optional<Controller::AttemptEnd> Controller::attempt_end() const {
  if (interrupted_) return AttemptEnd{interrupted_};
  const auto& failures = attempt_->failures;
  if (failures.settled(now(), kFailureGrace) && remote_workers_accounted()) {
    return AttemptEnd{after_early_return(failures.root_cause())};
  }
  // Done once every rank returned and the last checkpoint is committed (a
  // group about to regroup that finished meanwhile is done too).
  if ((phase_ == RunPhase::kTraining || phase_ == RunPhase::kRegrouping) &&
      !attempt_->async_checkpoint &&
      std::all_of(pool().workers().begin(), pool().workers().end(), [&](const WorkerSlot& w) {
        // A replacement that never joined: the group finished without it.
        return w.done || w.departed || pending_replacement(w);
      })) {
    return AttemptEnd{};
  }
  if (phase_ == RunPhase::kRegrouping) return AttemptEnd{std::nullopt, true};
  return std::nullopt;
}

void Controller::end_attempt(const AttemptEnd& end) {
  finish_stacks(true);  // what answered before the workers stopped
  auto& info = attempts_.back();
  info.ended_at = run_directory::timestamp_now();
  info.regrouped = end.regroup;
  if (end.error) {
    info.error = end.error;
    info.error->attempt = setup_.attempt_offset + attempt_->number;
  }
  // Workers of one host share a cache: one fetches, the others find it there.
  if (const int sent = attempt_->plugin_downloads; sent > 0) {
    log_.info("sent the plugin to {} {}{}", sent, sent == 1 ? "worker" : "workers",
              sent < world_size() ? "; the others found it in their host's plugin cache" : "");
  }
  notify_attempts();
}

// Before an attempt that follows attempts that failed without recording a
// report: a deterministic failure at the start (with no failure limit) would
// otherwise restart as fast as it fails. 0.5 s after the second, doubling to
// 30 s; the socket is served meanwhile, so agents and standby workers stay.
void Controller::back_off() {
  if (attempt_->reported > 0) {
    idle_failures_ = 0;
    return;
  }
  if (++idle_failures_ < 2) return;
  auto delay = std::chrono::milliseconds(500) * (1 << std::min(idle_failures_ - 2, 6));
  delay = std::min<std::chrono::milliseconds>(delay, std::chrono::seconds(30));
  log_.warn("waiting {:.1f} s before attempt {}: the last {} attempts failed before any report",
            std::chrono::duration<double>(delay).count(),
            setup_.attempt_offset + attempt_->number + 1, idle_failures_);
  enter(RunPhase::kBackingOff);
  serve_until(now() + delay, [&] { return interrupted_.has_value(); });
}

void Controller::maybe_assign() {
  if (phase_ != RunPhase::kGathering) return;
  const int hellos = attempt_->hellos;
  if (hellos == max_workers()) {
    assign_ranks();
    return;
  }
  // A restart knows which workers to expect: its local ones and those its node
  // agents announced. Once they are all here, and enough, it goes on without
  // waiting for the ones that are gone.
  if (attempt_->number < 2 || hellos < min_workers()) return;
  for (const auto& [id, agent] : agents_) {
    if (!agent.announced) return;
  }
  int connected_claims = 0;
  for (const auto& worker : pool().workers()) {
    if (!worker.main_id) return;
    if (worker.remote && attempt_->claimed.count(process_key(worker.host, worker.process.pid))) {
      ++connected_claims;
    }
  }
  if (connected_claims < attempt_->agent_claims) return;
  log_.warn("attempt {} goes on with {} of {} workers", setup_.attempt_offset + attempt_->number,
            hellos, max_workers());
  assign_ranks();
}

void Controller::assign_ranks() {
  std::vector<std::string> hosts;
  for (const auto& worker : pool().workers()) hosts.push_back(worker.host);
  auto placements = trainrun::assign_ranks(hosts);
  // The attempt's group: every worker here (fewer than the most in an elastic
  // run that goes on without some).
  auto& attempt = *attempt_;
  attempt.world_size = pool().size();
  attempt.reports = ReportCoordinator(
      attempt.world_size, storage_.last_result() ? storage_.last_result()->iteration : 0);
  attempt.store = RendezvousStore(RendezvousStore::capacity_for(attempt.world_size));
  attempts_.back().world_size = attempt.world_size;
  notify_attempts();
  attempt.assigned_at = now();
  // An elastic group that starts without an agent's workers (they came late)
  // takes them at its next checkpoint or attempt.
  for (auto& [id, agent] : agents_) {
    if (agent.waiting || agent.workers.empty()) continue;
    bool any_here = false;
    for (int64_t pid : agent.workers) any_here = any_here || pool().remote_worker(agent.host, pid);
    if (any_here) continue;
    agent.waiting = true;
    log_.info("{}: its workers join the group at its next checkpoint", agent.describe());
    to_agent(id, agent, protocol::Shutdown{"it joins at the next attempt", true});
  }
  std::vector<int> ranks;
  for (const auto& place : placements) ranks.push_back(place.world_rank);
  pool().assign(ranks);
  attempt.members.clear();
  for (int rank = 0; rank < attempt.world_size; ++rank) attempt.members.push_back(rank);
  // Where the ranks run, a line per node: a node's ranks are consecutive.
  std::vector<std::pair<int, int>> node_ranks;  // first and last rank, by node rank
  for (const auto& place : placements) {
    auto node = static_cast<size_t>(place.node_rank);
    if (node_ranks.size() <= node) node_ranks.resize(node + 1, {world_size(), -1});
    node_ranks[node].first = std::min(node_ranks[node].first, place.world_rank);
    node_ranks[node].second = std::max(node_ranks[node].second, place.world_rank);
  }
  for (size_t node = 0; node < node_ranks.size(); ++node) {
    auto [first, last] = node_ranks[node];
    log_.info("node {} ({}): ranks {}-{}", node, pool().at_rank(first)->host, first, last);
  }
  attempt.placements.assign(static_cast<size_t>(attempt.world_size), Placement{});
  for (auto& worker : pool().workers()) {
    const Placement& place = placements[static_cast<size_t>(worker.index)];
    attempt.placements[static_cast<size_t>(place.world_rank)] = place;
    to_main(worker, assign_for(worker, place));
  }
  enter(RunPhase::kTraining);
}

protocol::Assign Controller::assign_for(WorkerSlot& worker, const Placement& place) {
  auto config = nlohmann::json::to_msgpack(setup_.options.config);
  protocol::Assign assign;
  assign.world_size = world_size();
  assign.run_name = setup_.options.run.name;
  assign.storage_path = setup_.options.run.storage_path.string();
  assign.entry = setup_.entry;
  assign.config.assign(config.begin(), config.end());
  assign.plugin_sha256 = setup_.plugin_sha256;
  assign.plugin_size = setup_.plugin_bytes->size();
  assign.plugin_name = setup_.options.plugin.filename().string();
  std::tie(assign.profile_first, assign.profile_last) = setup_.options.profile_steps;
  assign.store_prefix = "trainrun/attempt-" + std::to_string(attempt_->number);
  // Local workers alone: Gloo on loopback. With remote ones, each worker
  // binds the address that reaches the controller (or its --interface).
  assign.bind_host = listening_.empty() ? kLocalHost : "";
  assign.heartbeat_timeout_ms = setup_.options.run.heartbeat_timeout.count();
  assign.heartbeat_interval_ms = heartbeat_interval(setup_.options.run.heartbeat_timeout).count();
  assign.collective_timeout_ms = setup_.options.run.collective_timeout.count();
  assign.checkpoint_dir = checkpoints_.resume_dir().string();
  assign.in_place = setup_.options.failure.in_place;
  // A remote worker's own default unless the run names a thread count.
  assign.num_threads =
      worker.remote ? setup_.options.scaling.cpus_per_worker : setup_.cpus_per_worker;
  assign.fetch_checkpoint = checkpoints_.streams() || worker.remote;
  if (worker.remote) worker.attach_secret = make_secret();
  assign.attach_secret = worker.attach_secret;
  assign.storage_probe = worker.remote ? storage_probe_.string() : "";
  assign.storage_token = worker.remote ? storage_token_ : "";
  assign.world_rank = place.world_rank;
  assign.local_rank = place.local_rank;
  assign.node_rank = place.node_rank;
  assign.local_world_size = place.local_world_size;
  assign.device =
      setup_.options.scaling.use_gpu ? "cuda:" + std::to_string(place.local_rank) : "cpu";
  return assign;
}

// Once every rank's train function runs, with failures to survive: the next
// attempt's local workers start now, costing a worker's start of CPU while
// this attempt trains instead of at the restart.
void Controller::start_standby() {
  const int local = setup_.options.scaling.local_workers;
  const int max_failures = setup_.options.failure.max_failures;
  if (!setup_.options.failure.standby || local == 0 || standby_ || !healthy() ||
      (max_failures >= 0 && failures_used_ >= max_failures)) {
    return;
  }
  LaunchOptions launch = launch_;
  launch.scratch_dir = dir_.path() / ("standby-" + std::to_string(attempt_->number + 1));
  try {
    std::error_code ec;
    std::filesystem::create_directory(launch.scratch_dir, ec);
    if (ec) throw IoError("cannot create " + launch.scratch_dir.string() + ": " + ec.message());
    standby_ = std::make_unique<WorkerPool>();
    standby_->reserve(max_workers(), spare_workers());
    standby_->spawn(local, launch);
    log_.info("started {} standby workers for a restart", local);
  } catch (const IoError& e) {
    log_.warn("cannot start standby workers: {}", e.what());
    stop_standby();
  }
}

void Controller::reap_standby() {
  if (!standby_) return;
  for (auto [worker, wait_status] : standby_->reap()) {
    // Said only while it matters: when the run ends, no attempt follows.
    if (phase_ != RunPhase::kStopping) {
      log_.warn("a standby worker (pid {}) exited: the next attempt starts new workers",
                worker->process.pid);
    }
  }
}

bool Controller::standby_ready() const {
  return standby_ && std::none_of(standby_->workers().begin(), standby_->workers().end(),
                                  [](const WorkerSlot& w) { return w.exited; });
}

void Controller::stop_standby() {
  if (!standby_) return;
  standby_->signal_all(SIGTERM);
  // Real processes: waited for on the steady clock, whatever clock the run reads.
  auto deadline = Clock::now() + kTerminateGrace;
  while (!standby_->all_exited() && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    standby_->reap();
  }
  standby_->end_groups();  // SIGKILL to whatever is left
  for (auto until = Clock::now() + std::chrono::seconds(1);
       !standby_->all_exited() && Clock::now() < until;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    standby_->reap();  // no zombie left behind
  }
  standby_->drain_output();
  standby_.reset();
}

}  // namespace trainrun
