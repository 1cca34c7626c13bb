#include "controller/controller.h"

#include <trainrun/error.h>

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <thread>

#include "common/constants.h"
#include "common/seconds.h"
#include "storage/run_directory.h"

namespace trainrun {
namespace {

// A REPORT lists a checkpoint's files, an UPLOAD_CHUNK carries kChunkSize bytes.
constexpr int64_t kMaxFrame = 64 << 20;
constexpr int kPeerQueue = 64;

// Each worker costs the controller about four descriptors (two pipes, a log
// file, a connection); the soft limit (often 1024) is raised to the hard one.
void raise_descriptor_limit() {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur < limit.rlim_max) {
    limit.rlim_cur = limit.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &limit);
  }
}

}  // namespace

Controller::Controller(ControllerSetup setup, RunStorage& storage, CheckpointStore& checkpoints)
    : setup_(std::move(setup)),
      storage_(storage),
      log_(*setup_.log),
      // A rerun counts on from the last report recorded, not from the
      // checkpoint it resumes from: no iteration appears twice, and time_total_s
      // never goes back (reports after that checkpoint stay in the record).
      reports_(setup_.options.scaling.num_workers,
               storage.last_result() ? storage.last_result()->iteration : 0),
      checkpoints_(checkpoints, setup_.options.run.resume_from,
                   setup_.options.checkpoint.always_stream),
      plugin_(ChunkSource::from_memory(protocol::kPluginSource, setup_.plugin_bytes)),
      world_size_(setup_.options.scaling.num_workers),
      earlier_seconds_(storage.last_result() ? storage.last_result()->time_total_s : 0),
      store_(RendezvousStore::capacity_for(setup_.options.scaling.num_workers)) {
  pool_->reserve(world_size_);
}

Controller::~Controller() = default;

double Controller::elapsed() const {
  return std::chrono::duration<double>(Clock::now() - start_).count();
}

RunOutcome Controller::run() {
  raise_descriptor_limit();
  // Process-wide handlers only when asked (the trainrun command): workers'
  // exits come through pidfds, a host's stop() through stop_fd.
  if (setup_.options.handle_signals) signals_.emplace();
  router_.set(zmq::sockopt::linger, 0);
  router_.set(zmq::sockopt::router_mandatory, false);
  // A peer whose connection was reset reconnects under its own routing id
  // and keeps its place (protocol::connect_dealer).
  router_.set(zmq::sockopt::router_handover, true);
  // Bounds on what one peer costs: a frame larger than any message needs ends
  // its connection, and at most kPeerQueue messages wait for a peer that does
  // not read (a chunk is 1 MiB; a well-behaved worker has at most its credit
  // of chunks and a few replies queued). Beyond that its messages are dropped.
  router_.set(zmq::sockopt::maxmsgsize, kMaxFrame);
  router_.set(zmq::sockopt::sndhwm, kPeerQueue);
  router_.bind(dir_.endpoint());
  if (!setup_.options.network.listen.empty()) {
    try {
      listen();
    } catch (const zmq::error_t& e) {
      auto message = "cannot listen on " + setup_.options.network.listen + ": " + e.what();
      log_.error("{}", message);
      return RunOutcome{RunError{FailureKind::kSetup, message, -1, "", 0}, elapsed(), {}};
    }
  }
  if (!listening_.empty() && !checkpoints_.streams()) write_storage_probe();
  launch_.executable = setup_.options.worker_executable;
  launch_.endpoint = dir_.endpoint();
  launch_.scratch_dir = dir_.path();
  launch_.secret = secret_;
  launch_.cache_dir = setup_.options.cache_dir;
  launch_.startup_timeout = setup_.options.run.startup_timeout;
  launch_.threads = setup_.cpus_per_worker;
  launch_.logs_dir = storage_.logs_dir();
  launch_.echo = worker_echo();
  const int max_failures = setup_.options.failure.max_failures;
  std::optional<RunError> error;
  while (true) {
    bool retry = false;
    try {
      start_attempt();
      auto end = run_attempt();
      error = end.error;
      if (error) ++failures_used_;
      retry = end.regroup || (error && !interrupted_ && retryable(error->kind) &&
                              (max_failures < 0 || failures_used_ <= max_failures));
      end_attempt(end);
      stop_workers(!error && !end.regroup, retry);
      if (retry && !interrupted_) {
        if (end.regroup) {
          log_.info("attempt {}: the group grows from {} workers at checkpoint {}", attempt_ + 1,
                    world_size(), checkpoints_.latest_name());
        } else {
          log_.warn("attempt {}{} after {}", attempt_ + 1,
                    max_failures < 0
                        ? ""
                        : "/" + std::to_string(max_failures + 1 + attempt_ - failures_used_),
                    error->summary());
          back_off();
        }
      }
      if (retry && !interrupted_) reset_attempt();
    } catch (const std::exception& e) {
      // The last line of defence, outside an attempt's loop too.
      error =
          RunError{FailureKind::kInternal, std::string("internal error: ") + e.what(), -1, "", 0};
      log_.error("{}", error->message);
      retry = false;
      try {
        stop_workers(false);
      } catch (const std::exception&) {
        pool_->end_groups();  // SIGKILL to every worker's group, running or not
        if (standby_) standby_->end_groups();
      }
      break;
    }
    if (!retry) break;
    if (interrupted_) {  // during a stop for a restart: end what stays between attempts
      error = interrupted_;
      try {
        stop_workers(false);
      } catch (const std::exception& e) {
        log_.error("internal error while stopping the workers: {}", e.what());
        pool_->end_groups();
        if (standby_) standby_->end_groups();
      }
      break;
    }
  }
  checkpoints_.abort();  // what the last attempt staged and never committed
  summarize_dropped();
  if (error) error->attempt = attempt_;
  return RunOutcome{error, elapsed(), attempts_};
}

LineEcho Controller::worker_echo() const {
  if (!setup_.options.verbose) return {};
  if (setup_.output) return setup_.output;
  return [](int stream, std::string_view line) {
    std::FILE* out = stream == 0 ? stdout : stderr;
    std::fprintf(out, "%.*s\n", static_cast<int>(line.size()), line.data());
    std::fflush(out);
  };
}

bool Controller::retryable(FailureKind kind) {
  switch (kind) {
    case FailureKind::kException:
    case FailureKind::kSignal:
    case FailureKind::kExit:
    case FailureKind::kLost:
    case FailureKind::kSetup: return true;
    default: return false;  // usage, plugin, interrupted, storage, internal
  }
}

void Controller::start_attempt() {
  ++attempt_;
  attempt_start_ = Clock::now();
  next_timer_check_ = attempt_start_;
  AttemptInfo info;
  info.attempt = attempt_;
  info.world_size = max_workers();  // until the ranks are assigned
  info.started_at = run_directory::timestamp_now();
  info.resumed_from = checkpoints_.resume_dir().empty() ? ""
                      : checkpoints_.resume_dir().parent_path() == storage_.dir()
                          ? checkpoints_.resume_dir().filename().string()
                          : checkpoints_.resume_dir().string();
  attempts_.push_back(info);
  notify_attempts();
  if (attempt_ > 1) {
    log_.info("attempt {} starts from {}", attempt_,
              info.resumed_from.empty() ? "the start" : info.resumed_from);
    // Node agents start this attempt's workers and announce them with AGENT.
    for (auto& [id, agent] : agents_) to_agent(id, agent, protocol::Restart{attempt_});
  }
  const int local = setup_.options.scaling.local_workers;
  if (pool_->size() > 0) {  // the standby workers, started during the last attempt
    log_.info("attempt {} takes the {} standby workers", attempt_, pool_->size());
    maybe_assign();
    return;
  }
  try {
    pool_->spawn(local, launch_);
    if (attempt_ == 1) {
      log_.info("listening on {}; started {} workers ({} threads each)", launch_.endpoint, local,
                setup_.cpus_per_worker);
    }
  } catch (const IoError& e) {
    failures_.add(RunError{FailureKind::kSetup, e.what(), -1, "", 0});
    log_.error("{}", e.what());
  }
}

Controller::AttemptEnd Controller::run_attempt() {
  const auto interval = heartbeat_interval(setup_.options.run.heartbeat_timeout);
  auto next_heartbeat = Clock::now() + interval;
  while (true) {
    try {
      poll_once(std::min<std::chrono::milliseconds>(interval, std::chrono::milliseconds(100)));
      on_exits();
      check_timers();
      if (Clock::now() >= next_heartbeat) {
        send_heartbeats();
        next_heartbeat = Clock::now() + interval;
      }
    } catch (const std::exception& e) {
      // The last line of defence: whatever escaped a handler ends the run as
      // a failure with a final status and error.json, not as a crash.
      RunError error{FailureKind::kInternal, std::string("internal error: ") + e.what(), -1, "", 0};
      log_.error("{}", error.message);
      return {error};
    }
    if (interrupted_) return {interrupted_};
    if (failures_.settled(Clock::now(), kFailureGrace) && remote_workers_accounted()) {
      return {after_early_return(failures_.root_cause())};
    }
    // Done once every rank returned and the last checkpoint is committed.
    if (!failures_.any() && assigned_ && !async_checkpoint_ &&
        std::all_of(pool_->workers().begin(), pool_->workers().end(),
                    [](const WorkerSlot& w) { return w.done; })) {
      return {};
    }
    if (regroup_ && !failures_.any()) return {std::nullopt, true};
  }
}

// Before an attempt that follows attempts that failed without recording a
// report: a deterministic failure at the start (with no failure limit) would
// otherwise restart as fast as it fails. 0.5 s after the second, doubling to
// 30 s; the socket is served meanwhile, so agents and standby workers stay.
void Controller::back_off() {
  if (reported_this_attempt_ > 0) {
    idle_failures_ = 0;
    return;
  }
  if (++idle_failures_ < 2) return;
  auto delay = std::chrono::milliseconds(500) * (1 << std::min(idle_failures_ - 2, 6));
  delay = std::min<std::chrono::milliseconds>(delay, std::chrono::seconds(30));
  log_.warn("waiting {:.1f} s before attempt {}: the last {} attempts failed before any report",
            std::chrono::duration<double>(delay).count(), attempt_ + 1, idle_failures_);
  const auto interval = heartbeat_interval(setup_.options.run.heartbeat_timeout);
  auto next_heartbeat = Clock::now();
  for (auto until = Clock::now() + delay; Clock::now() < until && !interrupted_;) {
    if (Clock::now() >= next_heartbeat) {
      send_heartbeats();
      next_heartbeat = Clock::now() + interval;
    }
    poll_once(std::chrono::milliseconds(50));
  }
}

void Controller::end_attempt(const AttemptEnd& end) {
  auto& info = attempts_.back();
  info.ended_at = run_directory::timestamp_now();
  info.regrouped = end.regroup;
  if (end.error) {
    info.error = end.error;
    info.error->attempt = attempt_;
  }
  if (plugin_downloads_ > 0) {
    log_.info("the plugin was downloaded by {} of {} workers", plugin_downloads_, world_size());
  }
  notify_attempts();
}

// Once every rank's train function runs, with failures to survive: the next
// attempt's local workers start now, costing a worker's start of CPU while
// this attempt trains instead of at the restart.
void Controller::start_standby() {
  const int local = setup_.options.scaling.local_workers;
  const int max_failures = setup_.options.failure.max_failures;
  if (!setup_.options.failure.standby || local == 0 || standby_ || failures_.any() || stopping_ ||
      (max_failures >= 0 && failures_used_ >= max_failures)) {
    return;
  }
  LaunchOptions launch = launch_;
  launch.scratch_dir = dir_.path() / ("standby-" + std::to_string(attempt_ + 1));
  try {
    std::error_code ec;
    std::filesystem::create_directory(launch.scratch_dir, ec);
    if (ec) throw IoError("cannot create " + launch.scratch_dir.string() + ": " + ec.message());
    standby_ = std::make_unique<WorkerPool>();
    standby_->reserve(max_workers());
    standby_->spawn(local, launch);
    log_.info("started {} standby workers for a restart", local);
  } catch (const IoError& e) {
    log_.warn("cannot start standby workers: {}", e.what());
    stop_standby();
  }
}

bool Controller::standby_ready() const {
  return standby_ && std::none_of(standby_->workers().begin(), standby_->workers().end(),
                                  [](const WorkerSlot& w) { return w.exited; });
}

void Controller::stop_standby() {
  if (!standby_) return;
  standby_->signal_all(SIGTERM);
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

void Controller::notify_attempts() {
  // run.json keeps the first attempt and the latest ones: a run without a
  // failure limit may have thousands.
  if (attempts_.size() > kAttemptsKept) attempts_.erase(attempts_.begin() + 1);
  if (!setup_.on_attempts) return;
  try {
    setup_.on_attempts(attempts_);
  } catch (const std::exception& e) {  // run.json on a full disk: the run goes on
    log_.warn("cannot record the attempts: {}", e.what());
  }
}

std::chrono::milliseconds Controller::agent_silence_limit() const {
  const auto timeout = setup_.options.run.heartbeat_timeout;
  return std::max<std::chrono::milliseconds>(2 * heartbeat_interval(timeout), timeout / 2);
}

void Controller::reset_attempt() {
  // An agent that fell silent is gone with its node: the next attempt goes on
  // without it (the run's startup timeout waits for workers to replace it).
  // Judged first: what follows may take seconds without reading the socket.
  auto now = Clock::now();
  for (auto it = agents_.begin(); it != agents_.end();) {
    auto& agent = it->second;
    if (now - agent.last_heard > agent_silence_limit()) {
      log_.warn("{} is gone: the next attempt goes on without it", agent.describe());
      to_agent(it->first, agent, protocol::Shutdown{"it fell silent", false});
      it = agents_.erase(it);
      continue;
    }
    agent.workers.clear();
    agent.announced = agent.waiting = false;  // a waiting one is this attempt's
    agent.early_output.clear();
    agent.early_bytes = 0;
    ++it;
  }
  if (standby_) {  // one that died while this attempt stopped is not taken
    for (auto [worker, wait_status] : standby_->reap()) {
      log_.warn("a standby worker (pid {}) exited: the next attempt starts new workers",
                worker->process.pid);
    }
  }
  if (standby_ready()) {
    pool_ = std::move(standby_);
  } else {
    stop_standby();
    pool_ = std::make_unique<WorkerPool>();
    pool_->reserve(max_workers());
  }
  world_size_ = max_workers();  // until the ranks are assigned
  regroup_ = false;
  reported_this_attempt_ = 0;
  plugin_downloads_ = 0;
  checkpoints_.begin_attempt(attempt_ + 1);
  async_checkpoint_.reset();
  deferred_reports_.clear();
  owed_uploads_.clear();
  failures_ = FailureCollector();
  assigned_ = false;
  stopping_ = false;
  restarting_ = false;
  hellos_ = static_cast<int>(std::count_if(pool_->workers().begin(), pool_->workers().end(),
                                           [](const WorkerSlot& w) { return w.main_id; }));
  claimed_.clear();
  agent_claims_ = 0;
  child_exited_ = false;
}

void Controller::listen() {
  const auto& keys = setup_.keys;
  if (keys) {
    zap_.emplace(context_, *keys);
    make_curve_server(router_, *keys);  // for what binds from here on: not the Unix socket
  }
  const char* monitor = "inproc://trainrun-router-monitor";
  if (zmq_socket_monitor(router_.handle(), monitor,
                         ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL | ZMQ_EVENT_HANDSHAKE_FAILED_AUTH |
                             ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL) == 0) {
    monitor_.emplace(context_, zmq::socket_type::pair);
    monitor_->set(zmq::sockopt::linger, 0);
    monitor_->connect(monitor);
  }
  router_.bind(setup_.options.network.listen);
  listening_ = router_.get(zmq::sockopt::last_endpoint);
  log_.info("remote workers connect to {} ({})", listening_,
            keys ? "CURVE with the run key" : "no run key: neither encrypted nor authenticated");
}

// One pass of the loop: wait for the socket, the workers' output and exits,
// signals (when the run handles them), a stop from the host program and the
// ZAP handler; handle them.
void Controller::poll_once(std::chrono::milliseconds timeout) {
  // An absent descriptor is -1, which poll(2) skips.
  zmq::pollitem_t items[] = {{router_.handle(), 0, ZMQ_POLLIN, 0},
                             {nullptr, signals_ ? signals_->fd() : -1, ZMQ_POLLIN, 0},
                             {nullptr, pool_->output_fd(), ZMQ_POLLIN, 0},
                             {nullptr, setup_.stop_fd, ZMQ_POLLIN, 0},
                             {zap_ ? zap_->socket().handle() : nullptr, -1, ZMQ_POLLIN, 0},
                             {monitor_ ? monitor_->handle() : nullptr, -1, ZMQ_POLLIN, 0}};
  // The optional sockets last: their slots are skipped when absent.
  size_t count = monitor_ ? 6 : zap_ ? 5 : 4;
  protocol::poll(items, count, timeout);
  if (items[3].revents & ZMQ_POLLIN) {
    uint64_t count = 0;  // read, or it stays readable and every poll returns at once
    [[maybe_unused]] auto got = ::read(setup_.stop_fd, &count, sizeof(count));
    if (!interrupted_) {
      interrupted_ = RunError{FailureKind::kInterrupted,
                              "stopped by the host program (Trainer::stop)", -1, "", 0};
    }
  }
  if (zap_ && (items[4].revents & ZMQ_POLLIN)) {
    while (auto refused = zap_->answer()) on_refused_peer(*refused, "not this run's key");
  }
  if (monitor_ && (items[5].revents & ZMQ_POLLIN)) {
    while (true) {  // [event id and value] [endpoint]
      auto event = protocol::recv_frames(*monitor_, true);
      if (event.empty()) break;
      on_refused_peer(event.size() > 1 ? event[1].to_string() : listening_,
                      "its handshake failed: it does not hold this run's key");
    }
  }
  if (items[2].revents & ZMQ_POLLIN) pool_->forward_output();
  // Standby workers write little (their start): read on every pass, not polled.
  if (standby_) standby_->forward_output();
  if (pool_->take_exits() || (standby_ && standby_->take_exits())) child_exited_ = true;
  if (items[1].revents & ZMQ_POLLIN) on_signals();
  if (items[0].revents & ZMQ_POLLIN) {
    // Until the socket is empty (at most 256 messages, so that output and
    // signals get their turn): asking ZMQ_EVENTS before each one costs more.
    for (int i = 0; i < 256 && on_router_readable(); ++i) {
    }
  }
}

void Controller::on_signals() {
  for (int sig : signals_->drain()) {
    if (sig == SIGCHLD) {
      child_exited_ = true;
    } else if ((sig == SIGINT || sig == SIGTERM || sig == SIGHUP) && !interrupted_) {
      interrupted_ = RunError{FailureKind::kInterrupted,
                              "interrupted by " + signal_description(sig), -1, "", 0};
    }
  }
}

// Reaps the workers that exited: when SIGCHLD says some did, on every pass
// while the run is failing (a crash's exit must be seen within the grace
// period to be named the cause), and once a second in case a signal was lost.
// Not on every pass otherwise: a waitpid per worker per pass costs a thousand
// system calls a pass at scale.
void Controller::on_exits() {
  auto now = Clock::now();
  if (!child_exited_ && !failures_.any() && now < next_reap_) return;
  child_exited_ = false;
  next_reap_ = now + std::chrono::seconds(1);
  if (standby_) {
    for (auto [worker, wait_status] : standby_->reap()) {
      log_.warn("a standby worker (pid {}) exited: the next attempt starts new workers",
                worker->process.pid);
    }
  }
  for (auto [worker, wait_status] : pool_->reap()) {
    if (!wait_status) {
      if (worker->rank >= 0) store_.forget(worker->rank);
      if (!worker->done) {
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
  if (worker.rank >= 0) store_.forget(worker.rank);
  if (stopping_ || (worker.done && code == 0)) return;
  if (code) {
    fail(worker, FailureKind::kExit, exit_description(code, signal) + " before finishing");
  } else {
    fail(worker, FailureKind::kSignal, exit_description(code, signal));
  }
}

// Startup and heartbeat timeouts, checked every 100 ms rather than every pass.
// Startup lasts until a worker's train function starts: a plugin whose static
// constructor blocks, or a rank stuck joining the process group, still sends
// heartbeats from its main thread, and would otherwise hang the run forever.
void Controller::check_timers() {
  auto now = Clock::now();
  if (now < next_timer_check_) return;
  next_timer_check_ = now + std::chrono::milliseconds(100);
  if (now >= next_drop_summary_) {
    summarize_dropped();
    next_drop_summary_ = now + std::chrono::seconds(1);
  }
  const auto& run = setup_.options.run;
  bool starting = now - attempt_start_ > run.startup_timeout;
  if (starting) check_startup();
  for (auto& worker : pool_->workers()) {
    if (worker.exited) continue;
    if (starting && !worker.main_id) {
      fail(worker, FailureKind::kSetup,
           "did not connect to the controller within " + seconds_text(run.startup_timeout));
    } else if (assigned_ && !worker.started && now - assigned_at_ > run.startup_timeout) {
      fail(worker, FailureKind::kSetup,
           "did not start its train function within " + seconds_text(run.startup_timeout) +
               " (stuck loading the plugin or joining the process group)");
    } else if (worker.main_id && now - worker.last_heard > run.heartbeat_timeout) {
      fail(worker, FailureKind::kLost,
           "sent nothing for " + seconds_text(run.heartbeat_timeout) + ": stopped responding" + silent_agent(worker, now));
    }
  }
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
  auto since = failures_.first();
  return std::all_of(pool_->workers().begin(), pool_->workers().end(), [&](const WorkerSlot& w) {
    return !w.remote || w.failed || w.exited || w.done || w.last_heard > since;
  });
}

void Controller::maybe_assign() {
  if (assigned_ || stopping_ || failures_.any()) return;
  if (hellos_ == max_workers()) {
    assign_ranks();
    return;
  }
  // A restart knows which workers to expect: its local ones and those its node
  // agents announced. Once they are all here, and enough, it goes on without
  // waiting for the ones that are gone.
  if (attempt_ < 2 || hellos_ < min_workers()) return;
  for (const auto& [id, agent] : agents_) {
    if (!agent.announced) return;
  }
  int connected_claims = 0;
  for (const auto& worker : pool_->workers()) {
    if (!worker.main_id) return;
    if (worker.remote && claimed_.count(process_key(worker.host, worker.process.pid))) {
      ++connected_claims;
    }
  }
  if (connected_claims < agent_claims_) return;
  log_.warn("attempt {} goes on with {} of {} workers", attempt_, hellos_, max_workers());
  assign_ranks();
}

// One line per ten seconds at most, however many strangers knock.
void Controller::on_refused_peer(const std::string& where, const char* why) {
  if (refused_.allow(Clock::now())) {
    log_.warn("refused a peer at {}: {} (one line per 10 s)", where.substr(0, 128), why);
  }
}

// Remote workers have no slot until they connect: the run fails when fewer
// than all have come by the end of the startup timeout.
void Controller::check_startup() {
  // Once every worker said HELLO the ranks are assigned; a failure already
  // recorded ends the run anyway.
  if (assigned_ || failures_.any()) return;
  const bool connected = std::all_of(pool_->workers().begin(), pool_->workers().end(),
                                     [](const WorkerSlot& w) { return w.main_id.has_value(); });
  if (connected && hellos_ >= min_workers()) {  // elastic: the workers that came
    log_.warn("starting with {} of {} workers: no more connected within {}", hellos_,
              max_workers(), seconds_text(setup_.options.run.startup_timeout));
    assign_ranks();
    return;
  }
  int remote = max_workers() - setup_.options.scaling.local_workers;
  auto message = "only " + std::to_string(hellos_) + " of " + std::to_string(max_workers()) +
                 " workers connected within " + seconds_text(setup_.options.run.startup_timeout);
  if (elastic()) message += " (the fewest to start with: " + std::to_string(min_workers()) + ")";
  if (remote > 0) {
    message += " (" + std::to_string(remote) + " to connect to " +
               (listening_.empty() ? setup_.options.network.listen : listening_) + ")";
  }
  failures_.add(RunError{FailureKind::kSetup, message, -1, "", 0});
  log_.error("{}", message);
}

void Controller::summarize_dropped() {
  if (int more = dropped_.take_suppressed(); more > 0) {
    log_.warn("dropped {} more messages (only the first 10 a second are logged)", more);
  }
}

void Controller::send_heartbeats() {
  for (auto& worker : pool_->workers()) {
    if (worker.main_id && !worker.exited) to_main(worker, worker.main_link.heartbeat());
  }
  if (standby_) {
    for (auto& worker : standby_->workers()) {
      if (worker.main_id && !worker.exited) to_main(worker, worker.main_link.heartbeat());
    }
  }
  for (auto& [id, agent] : agents_) to_agent(id, agent, agent.link.heartbeat());
}

// An agent that missed two of its heartbeats (one a second) is gone, or cut
// off: its workers' exits will not come.
bool Controller::agents_done() const {
  auto now = Clock::now();
  return std::all_of(agents_.begin(), agents_.end(), [&](const auto& entry) {
    return entry.second.workers.empty() || now - entry.second.last_heard > 2 * kHeartbeatInterval;
  });
}

// Ends every worker: SHUTDOWN when the run succeeded, SIGTERM to each worker's
// process group otherwise; SIGKILL for any still alive after the grace period.
void Controller::stop_workers(bool graceful, bool restart) {
  stopping_ = true;
  restarting_ = restart;
  const char* reason = graceful ? "finished" : restart ? "a new attempt" : "the run failed";
  for (auto& [id, agent] : agents_) to_agent(id, agent, protocol::Shutdown{reason, restart});
  for (auto& worker : pool_->workers()) {
    // Remote workers exit on SHUTDOWN whether or not the run succeeded; local
    // ones that failed are signalled.
    if (worker.main_id && !worker.exited && (graceful || worker.remote)) {
      to_main(worker, protocol::Shutdown{reason, restart});
    }
  }
  if (!graceful) pool_->signal_all(SIGTERM);
  // Heartbeats go on: node agents that wait between attempts count the
  // controller's silence.
  const auto interval = heartbeat_interval(setup_.options.run.heartbeat_timeout);
  auto next_heartbeat = Clock::now() + interval;
  auto reap = [&](std::chrono::milliseconds wait) {
    poll_once(wait);
    pool_->reap();
    if (Clock::now() >= next_heartbeat) {
      send_heartbeats();
      next_heartbeat = Clock::now() + interval;
    }
  };
  // Node agents report their workers' exits, and forward their last lines, meanwhile.
  auto deadline = Clock::now() + kTerminateGrace;
  while ((!pool_->all_exited() || !agents_done()) && Clock::now() < deadline) {
    reap(std::chrono::milliseconds(50));
  }
  pool_->signal_all(SIGKILL);
  // SIGKILL ends a process unless it is stuck in the kernel (an uninterruptible
  // wait on a dead device): bounded, then given up on.
  deadline = Clock::now() + kTerminateGrace;
  while (!pool_->all_exited() && Clock::now() < deadline) reap(std::chrono::milliseconds(20));
  for (auto& worker : pool_->workers()) {
    if (!worker.exited && !worker.remote) {
      log_.error("{} did not exit after SIGKILL", worker.describe());
    }
  }
  // What the train functions started (their processes stay in the worker's
  // group) ends with them, on success too.
  pool_->end_groups();
  pool_->drain_output();  // the last lines before each exit
  // What the workers sent before they exited, while they are still known.
  for (int i = 0; i < 100000 && on_router_readable(); ++i) {
  }
  if (!restart) stop_standby();
  if (!restart && !storage_probe_.empty()) {
    std::error_code ec;
    std::filesystem::remove(storage_probe_, ec);
  }
}

void Controller::write_storage_probe() {
  auto path = storage_.dir() / ".storage-probe";
  try {
    write_file_atomic(path, storage_token_);
    storage_probe_ = path;
  } catch (const IoError& e) {
    log_.warn("remote workers will stream their checkpoints: {}", e.what());
  }
}

RunError Controller::after_early_return(RunError error) const {
  if (error.kind != FailureKind::kException || error.rank < 0 || !assigned_) return error;
  // Only a collective's error that a closed connection explains (Gloo's TCP
  // pairs): a rank that returned may be right, and another's error unrelated.
  const bool peer_gone = error.message.find("closed by peer") != std::string::npos ||
                         error.message.find("reset by peer") != std::string::npos;
  if (!peer_gone) return error;
  const WorkerSlot* failed = pool_->at_rank(error.rank);
  if (failed == nullptr || failed->done) return error;
  const auto& workers = pool_->workers();
  auto returned = std::find_if(workers.begin(), workers.end(),
                               [](const WorkerSlot& w) { return w.done && w.rank >= 0; });
  if (returned == workers.end()) return error;
  // A rank that returns closes its connections to its peers (as a process
  // that exits does), so one still training fails at its next collective:
  // the return is the cause to name, the collective's error the evidence.
  const int64_t reports = reports_.iteration() - 1;
  return RunError{FailureKind::kUsage,
                  "returned from train_func after " + std::to_string(reports) +
                      (reports == 1 ? " report" : " reports") + " while rank " +
                      std::to_string(error.rank) + ", after as many, was still training; rank " +
                      std::to_string(error.rank) + " then " + error.message +
                      ". Every rank must run the same collectives and call train::report the "
                      "same number of times",
                  returned->rank, returned->host, returned->process.pid};
}

void Controller::fail(WorkerSlot& worker, FailureKind kind, const std::string& message) {
  if (worker.failed) return;
  worker.failed = true;
  failures_.add(RunError{kind, message, worker.display_rank(), worker.host, worker.process.pid});
  log_.error("{} {}", worker.describe(), message);
}

void Controller::fail_storage(const std::string& message) {
  failures_.add(RunError{FailureKind::kStorage, message, -1, "", 0});
  log_.error("{}", message);
}

void Controller::abort_upload(const std::string& message) {
  checkpoints_.abort();
  // Earlier checkpoints are intact; the run cannot go on without this one.
  fail_storage("checkpoint upload failed: " + message);
}

}  // namespace trainrun
