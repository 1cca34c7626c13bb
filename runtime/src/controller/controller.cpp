// The run: its setup, its attempts in a row until one finishes or the failures
// allowed are spent, what it records, and how a failure is recorded.

#include "controller/controller.h"

#include <trainrun/error.h>

#include <sys/resource.h>

#include "common/constants.h"
#include "common/in_process.h"
#include "common/seconds.h"

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
      time_(setup_.time != nullptr ? *setup_.time : steady_time()),
      context_(setup_.context != nullptr ? *setup_.context : own_context_.emplace()),
      start_(time_.now()),
      checkpoints_(checkpoints, setup_.options.run.resume_from,
                   setup_.options.run.resume_from_first, setup_.options.checkpoint.always_stream),
      plugin_(ChunkSource::from_memory(protocol::kPluginSource, setup_.plugin_bytes)),
      earlier_seconds_(storage.last_result() ? storage.last_result()->time_total_s : 0),
      next_heartbeat_(start_),
      next_reap_(start_),
      next_drop_summary_(start_) {}

Controller::~Controller() = default;

double Controller::elapsed() const { return std::chrono::duration<double>(now() - start_).count(); }

void Controller::enter(RunPhase next) {
  if (next == phase_) return;
  TRAINRUN_CHECK(phase_allows(phase_, next), "the run cannot go from " +
                                                 std::string(to_string(phase_)) + " to " +
                                                 std::string(to_string(next)));
  phase_ = next;
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
  if (setup_.options.scaling.in_process) {
    launch_.in_process = true;
    launch_.in_process_module = find_in_process_module(launch_.executable);
    launch_.plugin = setup_.options.plugin;
  }
  watch_sources();
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
          log_.info("attempt {}: the group grows from {} workers at checkpoint {}",
                    setup_.attempt_offset + attempt_->number + 1, world_size(),
                    checkpoints_.latest_name());
        } else {
          log_.warn("attempt {}{} after {}", setup_.attempt_offset + attempt_->number + 1,
                    max_failures < 0 ? ""
                                     : "/" + std::to_string(setup_.attempt_offset + max_failures +
                                                            1 + attempt_->number - failures_used_),
                    error->summary());
          back_off();
        }
      }
    } catch (const std::exception& e) {
      // The last line of defence, outside an attempt's loop too.
      error =
          RunError{FailureKind::kInternal, std::string("internal error: ") + e.what(), -1, "", 0};
      log_.error("{}", error->message);
      retry = false;
      try {
        stop_workers(false);
      } catch (const std::exception&) {
        if (attempt_) pool().end_groups();  // SIGKILL to every worker's group, running or not
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
        pool().end_groups();
        if (standby_) standby_->end_groups();
      }
      break;
    }
  }
  checkpoints_.abort();  // what the last attempt staged and never committed
  summarize_dropped();
  phase_ = RunPhase::kEnded;  // from whatever phase an internal error left
  if (error) error->attempt = attempt_ ? setup_.attempt_offset + attempt_->number : 0;
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
    case FailureKind::kTimeout:
    case FailureKind::kSetup: return true;
    default: return false;  // usage, plugin, interrupted, storage, internal
  }
}

void Controller::listen() {
  const auto& keys = setup_.keys;
  if (keys) {
    zap_.emplace(context_, *keys);
    make_curve_server(router_, *keys);  // for what binds from here on: not the Unix socket
  }
  // One name per controller: a test may run several in one context.
  const auto monitor = "inproc://trainrun-router-monitor-" + make_secret();
  if (zmq_socket_monitor(router_.handle(), monitor.c_str(),
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

void Controller::write_storage_probe() {
  auto path = storage_.dir() / ".storage-probe";
  try {
    write_file_atomic(path, storage_token_);
    storage_probe_ = path;
  } catch (const IoError& e) {
    log_.warn("remote workers will stream their checkpoints: {}", e.what());
  }
}

// One line per ten seconds at most, however many strangers knock.
void Controller::on_refused_peer(const std::string& where, const char* why) {
  if (refused_.allow(now())) {
    log_.warn("refused a peer at {}: {} (one line per 10 s)", where.substr(0, 128), why);
  }
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

void Controller::summarize_dropped() {
  if (int more = dropped_.take_suppressed(); more > 0) {
    log_.warn("dropped {} more messages (only the first 10 a second are logged)", more);
  }
}

void Controller::record_failure(RunError error) {
  attempt_->failures.add(std::move(error), now());
  // Once the workers stop, a failure is still recorded (the root cause is
  // already taken), but the phase stays.
  if (healthy()) enter(RunPhase::kFailing);
}

void Controller::fail(WorkerSlot& worker, FailureKind kind, const std::string& message,
                      std::vector<std::string> stack) {
  if (worker.failed) return;
  // A replacement that never joined: the group goes on without it.
  if (pending_replacement(worker) && attempt_->replacement->generation == 0) {
    drop_replacement(message);
    return;
  }
  worker.failed = true;
  record_failure(RunError{kind, message, worker.display_rank(), worker.host, worker.process.pid, 0,
                          std::move(stack)});
  log_.error("{} {}", worker.describe(), message);
}

void Controller::fail_storage(const std::string& message) {
  record_failure(RunError{FailureKind::kStorage, message, -1, "", 0});
  log_.error("{}", message);
}

void Controller::abort_upload(const std::string& message) {
  checkpoints_.abort();
  // Earlier checkpoints are intact; the run cannot go on without this one.
  fail_storage("checkpoint upload failed: " + message);
}

}  // namespace trainrun
