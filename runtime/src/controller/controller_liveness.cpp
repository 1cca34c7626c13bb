// The loop and what keeps a run alive or ends it: the sources the loop
// watches, heartbeats both ways, startup and heartbeat timeouts, workers'
// exits, signals and the host program's stop, and stopping the workers.

#include <trainrun/error.h>

#include <sys/wait.h>
#include <unistd.h>

#include <csignal>

#include "common/constants.h"
#include "common/crash_report.h"
#include "common/seconds.h"
#include "controller/controller.h"

namespace trainrun {

// What the loop waits for besides the workers: the socket, signals (when the
// run handles them), a stop from the host program, and the ZAP handler and
// the socket's monitor when the run listens.
void Controller::watch_sources() {
  loop_.watch(setup_.stop_fd, [this] { on_stop_fd(); });
  if (zap_) {
    loop_.watch(zap_->socket(), [this] {
      while (auto refused = zap_->answer()) on_refused_peer(*refused, "not this run's key");
    });
  }
  if (monitor_) loop_.watch(*monitor_, [this] { on_monitor(); });
  // The attempt's workers' output before messages: a worker's last lines (a
  // traceback) come before the controller's line about its failure. Its
  // descriptor changes with each attempt's pool (watch_pool).
  pool_watch_ = loop_.watch(-1, [this] { pool().forward_output(); });
  if (signals_) loop_.watch(signals_->fd(), [this] { on_signals(); });
  loop_.watch(router_, [this] {
    // Until the socket is empty (at most 256 messages, so that output and
    // signals get their turn): asking ZMQ_EVENTS before each one costs more.
    for (int i = 0; i < 256 && on_router_readable(); ++i) {
    }
  });
}

void Controller::watch_pool() { loop_.rewatch(pool_watch_, pool().output_fd()); }

void Controller::serve_until(Clock::time_point deadline, const std::function<bool()>& done) {
  const auto interval = heartbeat_interval(setup_.options.run.heartbeat_timeout);
  while (!done()) {
    auto start = now();
    if (start >= deadline) return;
    auto wait = std::min<Clock::duration>(
        {kLongestWait, interval, deadline - start, std::max(next_heartbeat_ - start, {})});
    loop_.wait(time_.longest_wait(std::chrono::ceil<std::chrono::milliseconds>(wait)));
    // Standby workers write little (their start): read on every pass, not watched.
    if (standby_) standby_->forward_output();
    if (pool().take_exits() || (standby_ && standby_->take_exits())) child_exited_ = true;
    on_exits();
    announce_losses();
    if (!stopping()) check_timers();
    if (now() >= next_heartbeat_) {
      send_heartbeats();
      next_heartbeat_ = now() + interval;
    }
  }
}

void Controller::on_stop_fd() {
  uint64_t count = 0;  // read, or it stays readable and every wait returns at once
  [[maybe_unused]] auto got = ::read(setup_.stop_fd, &count, sizeof(count));
  if (!interrupted_) {
    interrupted_ = RunError{FailureKind::kInterrupted,
                            "stopped by the host program (Trainer::stop)", -1, "", 0};
  }
}

void Controller::on_signals() {
  for (int sig : signals_->drain()) {
    if (sig == SIGCHLD) {
      child_exited_ = true;
    } else if (sig == SIGUSR1 && !stopping()) {  // (workers that stop answer nothing)
      collect_stacks("asked for with SIGUSR1");
    } else if ((sig == SIGINT || sig == SIGTERM || sig == SIGHUP) && !interrupted_) {
      interrupted_ = RunError{FailureKind::kInterrupted,
                              "interrupted by " + signal_description(sig), -1, "", 0};
    }
  }
}

void Controller::on_monitor() {
  while (true) {  // [event id and value] [endpoint]
    auto event = protocol::recv_frames(*monitor_, true);
    if (event.empty()) break;
    on_refused_peer(event.size() > 1 ? event[1].to_string() : listening_,
                    "its handshake failed: it does not hold this run's key");
  }
}

// Reaps the workers that exited: when SIGCHLD says some did, on every pass
// while the run fails or stops (a crash's exit must be seen within the grace
// period to be named the cause), and once a second in case a signal was lost.
// Not on every pass otherwise: a waitpid per worker per pass costs a thousand
// system calls a pass at scale.
void Controller::on_exits() {
  auto now = this->now();
  if (!child_exited_ && healthy() && now < next_reap_) return;
  child_exited_ = false;
  next_reap_ = now + std::chrono::seconds(1);
  reap_standby();
  for (auto [worker, wait_status] : pool().reap()) {
    if (!wait_status) {
      if (worker->rank >= 0) attempt_->store.forget(worker->rank);
      if (!worker->done && !stopping()) {
        fail(*worker, FailureKind::kExit,
             "exited before finishing (another part of this process collected its status)");
      }
      continue;
    }
    int status = *wait_status;
    if (WIFSIGNALED(status)) {
      on_worker_exit(*worker, std::nullopt, WTERMSIG(status));
    } else {
      on_worker_exit(*worker, WEXITSTATUS(status), 0);
    }
  }
}

// A worker ended, with an exit code or by a signal: reaped here, or reported
// by its node agent.
void Controller::on_worker_exit(WorkerSlot& worker, std::optional<int> code, int signal) {
  worker.exited = true;
  if (worker.rank >= 0 && !pending_replacement(worker)) attempt_->store.forget(worker.rank);
  // Its loss was dealt with: the group went on without it, or dropped it.
  if (worker.departed) return;
  if (stopping() || (worker.done && code == 0)) return;
  if (recover_in_place(worker, code ? FailureKind::kExit : FailureKind::kSignal,
                       exit_description(code, signal))) {
    return;
  }
  if (code) {
    fail(worker, FailureKind::kExit, exit_description(code, signal) + " before finishing");
    return;
  }
  // The worker's handler wrote where it died (worker/stacks.h).
  std::vector<std::string> stack;
  if (worker.output) stack = worker.output->crash_frames(signal_description(signal));
  auto place = innermost_place(stack, setup_.options.plugin.filename().string());
  fail(worker, FailureKind::kSignal,
       exit_description(code, signal) + (place.empty() ? "" : " " + place), std::move(stack));
}

// Startup and heartbeat timeouts, checked every 100 ms rather than every pass.
// Startup lasts until a worker's train function starts: a plugin whose static
// constructor blocks, or a rank stuck joining the process group, still sends
// heartbeats from its main thread, and would otherwise hang the run forever.
void Controller::check_timers() {
  auto now = this->now();
  if (now < attempt_->next_timer_check) return;
  attempt_->next_timer_check = now + std::chrono::milliseconds(100);
  if (now >= next_drop_summary_) {
    summarize_dropped();
    next_drop_summary_ = now + std::chrono::seconds(1);
  }
  const auto& run = setup_.options.run;
  // An in-process worker cannot fail to connect while this process runs,
  // and a debugger's pause is not a slow start.
  bool starting = now - attempt_->started > run.startup_timeout && !launch_.in_process;
  if (starting) check_startup();
  check_report_wait();
  if (attempt_->stacks && now >= attempt_->stacks->deadline) finish_stacks(true);
  for (auto& worker : pool().workers()) {
    // An in-process worker cannot be lost without this process, and a
    // debugger stops both for as long as it likes.
    if (worker.exited || worker.in_process() || worker.departed) continue;
    // A replacement not yet in the group: its startup began when it was
    // started, and the group goes on without it when it is too slow or lost.
    if (pending_replacement(worker) && attempt_->replacement->generation == 0) {
      if (!worker.started && now - *worker.replacing_since > run.startup_timeout) {
        drop_replacement("did not start its train function within " +
                         seconds_text(run.startup_timeout));
      } else if (worker.main_id && now - worker.last_heard > run.heartbeat_timeout) {
        drop_replacement("sent nothing for " + seconds_text(run.heartbeat_timeout));
      }
      continue;
    }
    if (starting && !worker.main_id && !worker.replacing_since) {
      fail(worker, FailureKind::kSetup,
           "did not connect to the controller within " + seconds_text(run.startup_timeout));
    } else if (attempt_->assigned() && !worker.started && !worker.replacing_since &&
               now - *attempt_->assigned_at > run.startup_timeout) {
      fail(worker, FailureKind::kSetup,
           "did not start its train function within " + seconds_text(run.startup_timeout) +
               " (stuck loading the plugin or joining the process group)");
    } else if (worker.main_id && now - worker.last_heard > run.heartbeat_timeout) {
      fail(worker, FailureKind::kLost,
           "sent nothing for " + seconds_text(run.heartbeat_timeout) + ": stopped responding" +
               silent_agent(worker, now));
    }
  }
}

// Remote workers have no slot until they connect: the run fails when fewer
// than all have come by the end of the startup timeout.
void Controller::check_startup() {
  // Once every worker said HELLO the ranks are assigned; a failure already
  // recorded ends the run anyway.
  if (phase_ != RunPhase::kGathering) return;
  const int hellos = attempt_->hellos;
  const bool connected = std::all_of(pool().workers().begin(), pool().workers().end(),
                                     [](const WorkerSlot& w) { return w.main_id.has_value(); });
  if (connected && hellos >= min_workers()) {  // elastic: the workers that came
    log_.warn("starting with {} of {} workers: no more connected within {}", hellos, max_workers(),
              seconds_text(setup_.options.run.startup_timeout));
    assign_ranks();
    return;
  }
  int remote = max_workers() - setup_.options.scaling.local_workers;
  auto message = "only " + std::to_string(hellos) + " of " + std::to_string(max_workers()) +
                 " workers connected within " + seconds_text(setup_.options.run.startup_timeout);
  if (elastic()) message += " (the fewest to start with: " + std::to_string(min_workers()) + ")";
  if (remote > 0) {
    message += " (" + std::to_string(remote) + " to connect to " +
               (listening_.empty() ? setup_.options.network.listen : listening_) + ")";
  }
  record_failure(RunError{FailureKind::kSetup, message, -1, "", 0});
  log_.error("{}", message);
}

// ", nor did its node agent: ..." when the worker's agent fell silent too
// (it missed two of its heartbeats).
std::string Controller::silent_agent(const WorkerSlot& worker, Clock::time_point now) const {
  for (const auto& [id, agent] : agents_) {
    if (agent.host == worker.host && agent.workers.count(worker.process.pid) &&
        now - agent.last_heard > 2 * heartbeat_interval(setup_.options.run.heartbeat_timeout)) {
      return ", nor did " + agent.describe() + ": the node or its agent is gone";
    }
  }
  return "";
}

// Whether every remote worker still running has been heard from since the
// first failure. A remote process that died (its host lost, its agent killed)
// is seen only when its heartbeats stop; until then its peers' collective
// errors ("Connection closed by peer") would look like the cause. A live one
// sends a heartbeat within a second; a dead one is declared lost at the
// heartbeat timeout, which ends the wait.
bool Controller::remote_workers_accounted() const {
  auto since = attempt_->failures.first();
  return std::all_of(pool().workers().begin(), pool().workers().end(), [&](const WorkerSlot& w) {
    return !w.remote || w.failed || w.exited || w.done || w.last_heard > since;
  });
}

void Controller::send_heartbeats() {
  for (auto& worker : pool().workers()) {
    if (worker.main_id && !worker.exited) to_main(worker, worker.main_link.heartbeat());
  }
  if (standby_) {
    for (auto& worker : standby_->workers()) {
      if (worker.main_id && !worker.exited) to_main(worker, worker.main_link.heartbeat());
    }
  }
  for (auto& [id, agent] : agents_) to_agent(id, agent, agent.link.heartbeat());
}

// A train function that reports again, or waits in a report, raises there,
// and its thread ends rather than stay in this process; an upload under way
// stops. Those that attach later are told as they do (on_attach).
void Controller::tell_in_process_threads(const WorkerSlot& worker) {
  const protocol::Shutdown stop{"the run is stopping", false};
  if (worker.train_id) to_train(worker, stop);
  if (worker.upload_id) protocol::send(router_, stop, {}, *worker.upload_id);
}

// Ends every worker: SHUTDOWN when the run succeeded, SIGTERM to each worker's
// process group otherwise; SIGKILL for any still alive after the grace period.
void Controller::stop_workers(bool graceful, bool restart) {
  enter(restart ? RunPhase::kRestarting : RunPhase::kStopping);
  if (!attempt_) {  // the first attempt could not be made: there are no workers yet
    stop_standby();
    return;
  }
  const char* reason = graceful ? "finished" : restart ? "a new attempt" : "the run failed";
  for (auto& [id, agent] : agents_) to_agent(id, agent, protocol::Shutdown{reason, restart});
  for (auto& worker : pool().workers()) {
    // Remote workers exit on SHUTDOWN whether or not the run succeeded, and
    // an in-process one, which no signal reaches; local ones that failed are
    // signalled.
    if (worker.main_id && !worker.exited && (graceful || worker.remote || worker.in_process())) {
      to_main(worker, protocol::Shutdown{reason, restart});
    }
    if (worker.in_process() && !worker.exited) tell_in_process_threads(worker);
  }
  if (!graceful) pool().signal_all(SIGTERM);
  // The loop goes on meanwhile: node agents report their workers' exits and
  // forward their last lines, and those that wait between attempts count the
  // controller's heartbeats.
  serve_until(now() + kTerminateGrace, [&] { return pool().all_exited() && agents_done(); });
  pool().signal_all(SIGKILL);
  // SIGKILL ends a process unless it is stuck in the kernel (an uninterruptible
  // wait on a dead device): bounded, then given up on.
  serve_until(now() + kTerminateGrace, [&] { return pool().all_exited(); });
  for (auto& worker : pool().workers()) {
    if (!worker.exited && !worker.remote) {
      log_.error("{} did not exit after SIGKILL", worker.describe());
    }
  }
  // What the train functions started (their processes stay in the worker's
  // group) ends with them, on success too.
  pool().end_groups();
  pool().drain_output();  // the last lines before each exit
  if (pool().train_left_running()) {
    log_.warn(
        "the train thread did not end (its train function had not returned): it runs on "
        "in this process");
  }
  // What the workers sent before they exited, while they are still known.
  for (int i = 0; i < 100000 && on_router_readable(); ++i) {
  }
  if (!restart) stop_standby();
  if (!restart && !storage_probe_.empty()) {
    std::error_code ec;
    std::filesystem::remove(storage_probe_, ec);
  }
}

}  // namespace trainrun
